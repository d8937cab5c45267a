"""The sm100 backend's mHC ops: each sublayer's entry and exit in the Triton kernels of
:mod:`~deepinfer_kernels_sm100.mhc`, :mod:`~deepinfer_kernels_sm100.mhc_fused` and
:mod:`~deepinfer_kernels_sm100.mhc_exit`.

A mixin of :class:`~deepinfer_kernels_sm100.backend.Sm100Backend`, so the op table's mHC half
reads on its own; like the backend, it imports the kernel modules inside the ops (this module
must import where Triton is missing).
"""

from __future__ import annotations

from torch import Tensor

from deepinfer.backends.base import Fp8Activation, StreamMix


def _parts(mix: StreamMix | None, x: Tensor, fn: Tensor) -> tuple[Tensor, ...] | None:
    """The mixer products ``mix`` holds if they are of streams ``x`` by mixer ``fn``."""
    return mix.parts if mix is not None and mix.of(x, fn) else None


class MhcKernels:
    """mHC entries (mixer, gates, Sinkhorn, collapse, norm) and exits as Triton kernels."""

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
        from deepinfer_kernels_sm100.mhc_fused import mhc_entry

        _, post, comb, u, _ = mhc_entry(x, fn, base, scale, norm_eps, hc_eps, sinkhorn_iters, True)
        assert u is not None
        return u, post, comb

    def mhc_pre_normed(
        self,
        x: Tensor,
        fn: Tensor,
        base: Tensor,
        scale: Tensor,
        weight: Tensor,
        *,
        norm_eps: float,
        hc_eps: float,
        sinkhorn_iters: int,
        eps: float,
        fp8: bool,
        mix: StreamMix | None = None,
    ) -> tuple[Tensor, Fp8Activation | None, Tensor, Tensor]:
        from deepinfer_kernels_sm100.mhc_fused import Normed, mhc_entry

        norm = Normed(weight, eps, fp8)
        mixed = _parts(mix, x, fn)
        entry = mhc_entry(x, fn, base, scale, norm_eps, hc_eps, sinkhorn_iters, True, norm, mixed)
        _, post, comb, normed, codes = entry
        assert normed is not None
        return normed, None if codes is None else Fp8Activation(*codes), post, comb

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
        mix: StreamMix | None = None,
    ) -> tuple[Tensor, Tensor, Tensor]:
        from deepinfer_kernels_sm100.mhc_fused import mhc_entry

        mixed = _parts(mix, x, fn)
        pre, post, comb, *_ = mhc_entry(
            x, fn, base, scale, norm_eps, hc_eps, sinkhorn_iters, False, None, mixed
        )
        return pre, post, comb

    def hc_mix(self, x: Tensor, fn: Tensor, norm_eps: float) -> Tensor:
        from deepinfer_kernels_sm100.mhc import hc_mix

        return hc_mix(x, fn, norm_eps)

    def mhc_collapse(self, x: Tensor, pre: Tensor) -> Tensor:
        from deepinfer_kernels_sm100.mhc import mhc_collapse

        return mhc_collapse(x, pre)

    def mhc_post(self, y: Tensor, x: Tensor, post: Tensor, comb: Tensor) -> Tensor:
        from deepinfer_kernels_sm100.mhc_exit import mhc_post

        return mhc_post(y, x, post, comb)

    def mhc_post_mix(  # noqa: PLR0917
        self, y: Tensor, x: Tensor, post: Tensor, comb: Tensor, fn: Tensor, norm_eps: float
    ) -> tuple[Tensor, StreamMix | None]:
        from deepinfer_kernels_sm100.mhc_exit import mhc_post_mix

        out, parts = mhc_post_mix(y, x, post, comb, fn)
        return out, None if parts is None else StreamMix(out, fn, parts)
