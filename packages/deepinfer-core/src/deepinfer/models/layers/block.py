"""One transformer layer: mHC(attention) then mHC(MoE), each on its own RMSNorm'd input."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from deepinfer.backends.base import Backend
from deepinfer.config import ModelConfig
from deepinfer.models.layers.attention import Attention
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


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.cfg = cfg
        self.layer_id = layer_id
        self.attn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.ffn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.attn = Attention(cfg, layer_id, dtype)
        self.ffn = MoE(cfg, layer_id, dtype)
        add_hc_params(self, "hc_attn", cfg)
        add_hc_params(self, "hc_ffn", cfg)
        # Sliding-only layers keep plain RoPE; compressed layers share the compressor's YaRN one.
        self.rope_kind = "main" if self.attn.kind == "swa" else "compress"

    def new_state(
        self, batch: int, dtype: torch.dtype, device: torch.device, slack: int = 0
    ) -> LayerState:
        return self.attn.new_state(batch, dtype, device, slack)

    def forward(self, x: Tensor, ctx: ForwardContext, state: LayerStates) -> Tensor:
        """``x``: residual streams [B, S, hc_mult, d]; ``state`` in the layout of the rows."""
        ops = ctx.ops
        rotary = ctx.rotary[self.rope_kind]

        def attn(u: Tensor) -> Tensor:
            return self.attn(ops, self.attn_norm(ops, u), ctx.positions, rotary, state)

        x = HyperConnection(self, "hc_attn", self.cfg)(ops, x, attn)
        return self.ffn_half(ops, x, ctx.input_ids)

    def ffn_half(self, ops: Backend, x: Tensor, input_ids: Tensor) -> Tensor:
        """mHC(MoE) of the streams (the token ids route hash layers)."""

        def ffn(u: Tensor) -> Tensor:
            return self.ffn(ops, self.ffn_norm(ops, u), input_ids)

        return HyperConnection(self, "hc_ffn", self.cfg)(ops, x, ffn)
