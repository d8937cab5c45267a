"""The backend's bf16 projections: decode batches through :mod:`.skinny_linear`, the rest
through torch's GEMM.

A mixin ahead of :class:`~deepinfer.backends.torch_ref.TorchBackend` in ``Sm100Backend``'s
bases, so its ``grouped_linear`` falls back to the reference's. Like the backend module it
imports no kernel module at import time (Triton may be missing where the registry loads it).
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor


class DenseProjections:
    """``linear``, ``grouped_linear`` and ``swiglu_mlp`` of bf16 weights on the GPU."""

    def linear(self, x: Tensor, weight: Tensor) -> Tensor:
        from deepinfer_kernels_sm100 import skinny_linear as skinny

        x = x.to(weight.dtype)
        if skinny.fits(x, weight):  # a decode batch: K split over the SMs
            return skinny.skinny_linear(x, weight)
        return F.linear(x, weight)

    def grouped_linear(self, x: Tensor, weight: Tensor) -> Tensor:
        from deepinfer_kernels_sm100 import skinny_linear as skinny

        groups = x.shape[-2]
        flat = x.to(weight.dtype).flatten(-2)
        if skinny.fits(flat, weight, groups):
            out = skinny.skinny_linear(flat, weight, groups=groups)
            return out.view(*x.shape[:-1], weight.shape[0] // groups)
        return super().grouped_linear(x, weight)  # type: ignore[misc]

    def swiglu_mlp(
        self, x: Tensor, w1: Tensor, w2: Tensor, w3: Tensor, swiglu_limit: float
    ) -> Tensor:
        from deepinfer_kernels_sm100.elementwise import swiglu

        x = x.to(w1.dtype)
        h = swiglu(self.linear(x, w1), self.linear(x, w3), swiglu_limit, w2.dtype)
        return self.linear(h, w2).float()
