"""One transformer layer: mHC(attention) then mHC(MoE), each on its own RMSNorm'd input."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from deepinfer.backends.base import Backend, Fp8Activation
from deepinfer.config import ModelConfig
from deepinfer.models.layers.attention import MQA, Attention
from deepinfer.models.layers.mhc import HyperConnection, add_hc_params
from deepinfer.models.layers.moe import MoE
from deepinfer.models.layers.norm import RMSNorm
from deepinfer.models.layers.rope import Rotary, per_call
from deepinfer.models.layouts import LayerStates
from deepinfer.models.state import LayerState


@dataclass
class ForwardContext:
    """Per-call metadata shared by every layer, so layer signatures stay small."""

    ops: Backend
    positions: Tensor  # [S] absolute positions of the new tokens; [B, 1] for a decode batch
    input_ids: Tensor  # [B, S] token ids (hash routing reads them)
    rotary: dict[str, Rotary]  # "main" (base theta) and "compress" (YaRN)

    def __post_init__(self) -> None:
        self.rotary = per_call(self.rotary)  # every layer rotates at ``positions``


class TransformerLayer(nn.Module):
    """What every V4 and V4.1 layer holds, under the official names: the two RMSNorms, the
    attention and MoE a version supplies, and both sublayers' mHC parameters. Sliding-only
    layers rotate with plain RoPE; compressed ones share their compressor's YaRN RoPE."""

    def __init__(
        self, cfg: ModelConfig, layer_id: int, attn: MQA, ffn: nn.Module, compressed: bool
    ) -> None:
        super().__init__()
        self.cfg = cfg
        self.layer_id = layer_id
        self.attn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.ffn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.attn = attn
        self.ffn = ffn
        add_hc_params(self, "hc_attn", cfg)
        add_hc_params(self, "hc_ffn", cfg)
        self.rope_kind = "compress" if compressed else "main"

    def new_state(
        self, batch: int, dtype: torch.dtype, device: torch.device, slack: int = 0
    ) -> LayerState:
        return self.attn.new_state(batch, dtype, device, slack)


class Block(TransformerLayer):
    """A V4 layer: mHC(attention) then mHC(MoE)."""

    def __init__(self, cfg: ModelConfig, layer_id: int, dtype: torch.dtype) -> None:
        attn = Attention(cfg, layer_id, dtype)
        super().__init__(cfg, layer_id, attn, MoE(cfg, layer_id, dtype), attn.kind != "swa")

    def forward(self, x: Tensor, ctx: ForwardContext, state: LayerStates) -> Tensor:
        """``x``: residual streams [B, S, hc_mult, d]; ``state`` in the layout of the rows."""
        ops = ctx.ops
        rotary = ctx.rotary[self.rope_kind]

        def attn(x: Tensor, x_fp8: Fp8Activation | None) -> Tensor:
            return self.attn(ops, x, ctx.positions, rotary, state, x_fp8=x_fp8)

        hc = HyperConnection(self, "hc_attn", self.cfg)
        x = hc.normed(ops, x, self.attn_norm, self.attn.wq_a, attn)
        return self.ffn_half(ops, x, ctx.input_ids)

    def ffn_half(self, ops: Backend, x: Tensor, input_ids: Tensor) -> Tensor:
        """mHC(MoE) of the streams (the token ids route hash layers)."""

        def ffn(x: Tensor, x_fp8: Fp8Activation | None) -> Tensor:
            return self.ffn(ops, x, input_ids, x_fp8)

        hc = HyperConnection(self, "hc_ffn", self.cfg)
        return hc.normed(ops, x, self.ffn_norm, self.ffn.shared_experts.w1, ffn)
