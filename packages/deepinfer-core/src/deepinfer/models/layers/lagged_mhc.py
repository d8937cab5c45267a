"""V4.1 mHC with the lagged pre-mix (``hc_pre_from_prev_sublayer``).

Each hyper-connection still computes its ``pre``, ``post`` and ``comb`` weights from its own
input streams, and still writes ``post * y + comb^T X`` back. What changes is which ``pre``
collapses the streams into the sublayer input: the previous hyper-connection's, computed one
sublayer earlier (so a kernel can fuse it into the previous step). The first sublayer of the
model has no predecessor and reads stream 0; the last ``pre`` collapses the final streams for
the head, replacing V4's separate ``hc_head``. Parameters keep the V4 names and shapes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import Tensor, nn

from deepinfer.backends.base import Backend
from deepinfer.config import ModelConfig


@dataclass
class LaggedHyperConnection:
    """Binds one set of HC parameters (``{prefix}_fn``/``_base``/``_scale``) of a module."""

    module: nn.Module
    prefix: str
    cfg: ModelConfig

    def __call__(
        self,
        ops: Backend,
        x: Tensor,
        pre_prev: Tensor | None,
        sublayer: Callable[[Tensor], Tensor],
    ) -> tuple[Tensor, Tensor]:
        """Streams ``x`` [B, S, n, d] and the previous HC's ``pre`` [B, S, n] (None for the
        model's first sublayer) -> (new streams, this HC's ``pre`` for the next sublayer)."""
        m, p, cfg = self.module, self.prefix, self.cfg
        pre, post, comb = ops.mhc_weights(
            x,
            getattr(m, f"{p}_fn"),
            getattr(m, f"{p}_base"),
            getattr(m, f"{p}_scale"),
            norm_eps=cfg.rms_norm_eps,
            hc_eps=cfg.hc_eps,
            sinkhorn_iters=cfg.hc_sinkhorn_iters,
        )
        u = x[..., 0, :] if pre_prev is None else ops.mhc_collapse(x, pre_prev)
        return ops.mhc_post(sublayer(u), x, post, comb), pre
