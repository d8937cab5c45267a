"""Multi-token prediction layer: predicts token t+2 from the main model's streams at t.

It joins the main model's pre-``hc_head`` streams at position t (``hnorm`` then ``h_proj``, per
stream) with the embedding of token t+1 (``enorm`` then ``e_proj``), runs one full V4 layer
(sliding-window only, learned routing, its own mHC and state), then its own ``hc_head`` and
``norm``. Embedding and output head are the main model's. Speculative decoding drives it.
"""

from __future__ import annotations

import torch
from torch import Tensor

from deepinfer.config import ModelConfig
from deepinfer.models.layers.block import Block, ForwardContext
from deepinfer.models.layers.mhc import HyperConnection, add_hc_params
from deepinfer.models.layers.norm import Linear, RMSNorm
from deepinfer.models.state import LayerState


class MTPBlock(Block):
    def __init__(self, cfg: ModelConfig, layer_id: int, dtype: torch.dtype) -> None:
        super().__init__(cfg, layer_id, dtype)
        d = cfg.hidden_size
        self.enorm = RMSNorm(d, cfg.rms_norm_eps)
        self.hnorm = RMSNorm(d, cfg.rms_norm_eps)
        self.e_proj = Linear(d, d, dtype, fp8_capable=True)
        self.h_proj = Linear(d, d, dtype, fp8_capable=True)
        self.norm = RMSNorm(d, cfg.rms_norm_eps)
        add_hc_params(self, "hc_head", cfg, head=True)

    def predict(
        self, streams: Tensor, next_embed: Tensor, ctx: ForwardContext, state: LayerState
    ) -> tuple[Tensor, Tensor]:
        """Returns (final hidden [B, S, d] fp32 for the head, this layer's output streams)."""
        ops = ctx.ops
        e = self.e_proj(ops, self.enorm(ops, next_embed))
        h = self.h_proj(ops, self.hnorm(ops, streams))
        x = self.forward(e[:, :, None] + h, ctx, state)
        collapsed = HyperConnection(self, "hc_head", self.cfg).head(ops, x)
        return self.norm(ops, collapsed.float()), x
