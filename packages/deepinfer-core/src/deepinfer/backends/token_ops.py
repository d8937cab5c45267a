"""The token-wise half of the Backend op table: mHC around every sublayer, Engram's gate, the
router and the experts.

These ops work on each token's own hidden state (no attention over others, no cache).
:class:`deepinfer.backends.base.Backend` inherits them; they live apart so that each half of
the op table reads on its own.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
from torch import Tensor


class TokenOps(ABC):
    """The token-wise ops every backend implements (B batch, S tokens, n mHC streams, d hidden,
    E experts, k routed experts per token)."""

    @abstractmethod
    def hc_mix(self, x: Tensor, fn: Tensor, norm_eps: float) -> Tensor:
        """mHC's mixer logits: the streams [..., n, d] flattened, RMS-normalised (no weight) and
        projected by ``fn`` [m, n * d], in fp32. Returns [..., m]."""

    @abstractmethod
    def mhc_pre(
        self,
        x: Tensor,
        fn: Tensor,
        base: Tensor,
        scale: Tensor,
        *,
        norm_eps: float,
        hc_eps: float,
        sinkhorn_iters: int,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """mHC entry: from streams ``x`` [B, S, n, d] compute (collapsed input [B, S, d],
        post weights [B, S, n] fp32, comb [B, S, n, n] fp32)."""

    @abstractmethod
    def mhc_post(self, y: Tensor, x: Tensor, post: Tensor, comb: Tensor) -> Tensor:
        """mHC exit: ``X'[k] = post[k] * y + sum_j comb[j, k] * X[j]``."""

    @abstractmethod
    def mhc_weights(
        self,
        x: Tensor,
        fn: Tensor,
        base: Tensor,
        scale: Tensor,
        *,
        norm_eps: float,
        hc_eps: float,
        sinkhorn_iters: int,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """The three mHC weight sets from streams ``x`` [B, S, n, d]: (pre [B, S, n], post
        [B, S, n], comb [B, S, n, n]), all fp32. V4.1's lagged pre-mix applies ``pre`` to the
        next sublayer's streams, so it is returned instead of being used here."""

    @abstractmethod
    def mhc_collapse(self, x: Tensor, pre: Tensor) -> Tensor:
        """``sum_i pre[i] * X[i]`` over the streams of ``x`` [B, S, n, d] in fp32, cast back."""

    @abstractmethod
    def engram_gate(
        self, h: Tensor, key: Tensor, q_weight: Tensor, k_weight: Tensor, eps: float
    ) -> Tensor:
        """Engram gate per stream: ``h``, ``key`` [B, S, n, d], weights [n, d] -> [B, S, n] fp32,
        ``sigmoid(sign(s) * sqrt(max(|s|, 1e-6)))`` with ``s`` the scaled dot product of the
        RMS-normalised (weighted) stream and key."""

    @abstractmethod
    def hc_head(
        self,
        x: Tensor,
        fn: Tensor,
        base: Tensor,
        scale: Tensor,
        *,
        norm_eps: float,
        hc_eps: float,
    ) -> Tensor:
        """Final stream collapse before the last norm: sigmoid weights, no Sinkhorn."""

    @abstractmethod
    def moe_route(
        self,
        x: Tensor,
        gate_weight: Tensor,
        bias: Tensor | None,
        *,
        topk: int,
        scoring_func: str,
        routed_scaling_factor: float,
        norm_topk_prob: bool,
        fixed_indices: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Router: returns (weights [N, k] fp32, expert ids [N, k] int64).

        ``bias`` only steers selection (aux-free balancing); ``fixed_indices`` (hash routing)
        replaces selection entirely while the scores still weight the experts.
        """

    @abstractmethod
    def moe_experts(
        self,
        x: Tensor,
        weights: Tensor,
        indices: Tensor,
        *,
        w13: Tensor,
        w2: Tensor,
        swiglu_limit: float,
        residual: Tensor | None = None,
        out_dtype: torch.dtype = torch.float32,
    ) -> Tensor:
        """Routed SwiGLU experts for ``x`` [N, d]; returns the fp32 weighted sum [N, d].

        ``w13`` [E, 2I, d] stacks each expert's gate (w1) over its up projection (w3); ``w2``
        is [E, d, I]. ``weights``/``indices`` [N, k] come from :meth:`moe_route`; an index < 0
        means "no expert" and contributes zero. ``residual`` [N, d] (the shared expert's
        output), if given, is widened and added to the fp32 sum after the experts, and the
        result is rounded once to ``out_dtype``: ``torch.add(sum, residual, out=...)``'s bits,
        which a backend can produce where it adds the experts, without a launch of its own
        (:func:`~deepinfer.backends.moe_ref.add_residual`).
        """

    def moe_experts_shared(
        self,
        x: Tensor,
        weights: Tensor,
        indices: Tensor,
        *,
        w13: Tensor,
        w2: Tensor,
        shared_w13: Tensor,
        shared_w2: Tensor,
        swiglu_limit: float,
        out_dtype: torch.dtype = torch.float32,
    ) -> Tensor:
        """:meth:`moe_experts` plus the shared expert, ``shared_w13`` [2I, d] (gate over up)
        and ``shared_w2`` [d, I]: an expert every token takes at weight 1, clamped alike, its
        output added after the routed slots and the sum rounded once to ``out_dtype``
        (:attr:`~deepinfer.backends.base.Backend.fuses_shared_expert`). Here composed of the
        ops: :meth:`swiglu_mlp` (its output in the weights' dtype, widened) as the residual; a
        backend may instead run it as one more expert of its grouped kernels and add its fp32
        output unrounded."""
        i = shared_w13.shape[0] // 2
        shared = self.swiglu_mlp(x, shared_w13[:i], shared_w2, shared_w13[i:], swiglu_limit)
        return self.moe_experts(
            x, weights, indices, w13=w13, w2=w2, swiglu_limit=swiglu_limit, residual=shared,
            out_dtype=out_dtype,
        )  # fmt: skip

    @abstractmethod
    def moe_experts_fp4(
        self,
        x: Tensor,
        weights: Tensor,
        indices: Tensor,
        *,
        w13: Tensor,
        w13_scale: Tensor,
        w2: Tensor,
        w2_scale: Tensor,
        swiglu_limit: float,
        scales_fit: bool = False,
        residual: Tensor | None = None,
        out_dtype: torch.dtype = torch.float32,
    ) -> Tensor:
        """:meth:`moe_experts` on FP4 e2m1 experts as stored: ``w13`` [E, 2I, d / 2] and ``w2``
        [E, d, I / 2] packed codes (uint8, the low nibble the even element), ``w13_scale``
        [E, 2I, d / 32] and ``w2_scale`` [E, d, I / 32] ue8m0 bytes, 2**(b - 127) per 32
        elements along the input dim. The weights' values are exact in ``x``'s dtype.
        ``scales_fit``: the caller found no scale byte above 128 (checked once, at load; see
        :func:`deepinfer.models.stored_formats.note_fp4_scale_range`), which a backend may use
        to decode with fewer operations; the result is the same either way."""

    @abstractmethod
    def swiglu_mlp(
        self, x: Tensor, w1: Tensor, w2: Tensor, w3: Tensor, swiglu_limit: float
    ) -> Tensor:
        """Dense clamped SwiGLU (the shared expert); returns fp32 [..., d]."""
