"""One V4.1 layer: Engram (some layers), then mHC(attention) and mHC(MoE) with the lagged pre-mix.

The MoE is V4's, plus an optional second router bias ``bias_vl`` that steers expert selection for
image-token rows (inferred from the V4.1 key list: "separate text and image bias terms"; the
mixing weights stay the unbiased scores, as for ``bias``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from deepinfer.backends.base import Backend, Fp8Activation
from deepinfer.config import ModelConfig
from deepinfer.models.layers.block import TransformerLayer
from deepinfer.models.layers.candidate_indexer import SharedKV
from deepinfer.models.layers.engram import Engram
from deepinfer.models.layers.lagged_mhc import LaggedHyperConnection
from deepinfer.models.layers.mhc import HyperConnection
from deepinfer.models.layers.moe import MoE
from deepinfer.models.layers.norm import fp32_param
from deepinfer.models.layers.rope import Rotary, per_call
from deepinfer.models.layers.shared_attention import SharedAttention
from deepinfer.models.layouts import LayerStates


@dataclass
class V41Context:
    """Per-call metadata for V4.1 layers."""

    ops: Backend
    positions: Tensor  # [S]; [B, 1] for a decode batch
    input_ids: Tensor  # [B, S]
    rotary: dict[str, Rotary]
    shared: SharedKV
    image_mask: Tensor | None  # [B, S] True at image-token positions
    #: [B, history + S] compressed ids with the look-back in front (one per span when packed)
    engram_ids: Tensor | None
    engram_history: int

    def __post_init__(self) -> None:
        self.rotary = per_call(self.rotary)  # every layer rotates at ``positions``


class ImageBiasMoE(MoE):
    def __init__(self, cfg: ModelConfig, layer_id: int, dtype: torch.dtype) -> None:
        super().__init__(cfg, layer_id, dtype)
        self.image_bias = cfg.moe_image_bias and not self.gate.hashed
        if self.image_bias:
            self.gate.bias_vl = fp32_param(cfg.n_routed_experts)

    def forward(
        self,
        ops: Backend,
        x: Tensor,
        input_ids: Tensor,
        image_mask: Tensor | None = None,
        x_fp8: Fp8Activation | None = None,
    ) -> Tensor:
        if not self.image_bias or image_mask is None or not bool(image_mask.any()):
            return super().forward(ops, x, input_ids, x_fp8)
        cfg = self.cfg
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        route = {
            "topk": cfg.num_experts_per_tok,
            "scoring_func": cfg.scoring_func,
            "routed_scaling_factor": cfg.routed_scaling_factor,
            "norm_topk_prob": cfg.norm_topk_prob,
        }
        w_text, i_text = ops.moe_route(flat, self.gate.weight, self.gate.bias, **route)
        w_img, i_img = ops.moe_route(flat, self.gate.weight, self.gate.bias_vl, **route)
        is_img = image_mask.reshape(-1, 1)
        weights = torch.where(is_img, w_img, w_text)
        indices = torch.where(is_img, i_img, i_text)
        flat_fp8 = x_fp8.flatten_rows() if x_fp8 is not None else None
        return self.combine(ops, flat, weights, indices, flat_fp8, x.dtype).view(shape)


class SharedBlock(TransformerLayer):
    """V4's layer with V4.1 attention, MoE, Engram and residual wiring (names unchanged)."""

    def __init__(self, cfg: ModelConfig, layer_id: int, dtype: torch.dtype) -> None:
        attn = SharedAttention(cfg, layer_id, dtype)
        ffn = ImageBiasMoE(cfg, layer_id, dtype)
        super().__init__(cfg, layer_id, attn, ffn, cfg.compress_ratio(layer_id) != 0)
        self.engram = Engram(cfg, layer_id, dtype) if layer_id in cfg.engram_layer_ids else None

    def forward(
        self, x: Tensor, pre: Tensor | None, ctx: V41Context, state: LayerStates
    ) -> tuple[Tensor, Tensor | None]:
        """Streams [B, S, n, d] and the carried ``pre`` -> (streams, ``pre`` to carry on)."""
        ops = ctx.ops
        rotary = ctx.rotary[self.rope_kind]
        if self.engram is not None:
            assert ctx.engram_ids is not None  # the model checks for the token map up front
            x = self.engram(ops, x, ctx.engram_ids, ctx.engram_history, ctx.image_mask)

        def attn(u: Tensor) -> Tensor:
            x, x_fp8 = self.attn_norm.feeding(ops, u, self.attn.wq_a)
            return self.attn(ops, x, ctx.positions, rotary, state, shared=ctx.shared, x_fp8=x_fp8)

        if not self.cfg.hc_pre_from_prev_sublayer:
            x = HyperConnection(self, "hc_attn", self.cfg)(ops, x, attn)
        else:
            x, pre = LaggedHyperConnection(self, "hc_attn", self.cfg)(ops, x, pre, attn)
        return self.ffn_half(ops, x, pre, ctx.input_ids, ctx.image_mask)

    def ffn_half(
        self,
        ops: Backend,
        x: Tensor,
        pre: Tensor | None,
        input_ids: Tensor,
        image_mask: Tensor | None,
    ) -> tuple[Tensor, Tensor | None]:
        """mHC(MoE) -> (streams, ``pre`` to carry on)."""

        def ffn(u: Tensor) -> Tensor:
            x, x_fp8 = self.ffn_norm.feeding(ops, u, self.ffn.shared_experts.w1)
            return self.ffn(ops, x, input_ids, image_mask, x_fp8)

        if not self.cfg.hc_pre_from_prev_sublayer:
            return HyperConnection(self, "hc_ffn", self.cfg)(ops, x, ffn), None
        return LaggedHyperConnection(self, "hc_ffn", self.cfg)(ops, x, pre, ffn)
