"""The backend's mixture-of-experts ops: the router in one kernel after its gate's GEMM, the
routed experts (bf16 or fp32 stacks, FP4 as stored) as grouped kernels, the shared expert as
one more expert of those kernels (:attr:`fuses_shared_expert`) or as dense GEMMs.

A mixin ahead of :class:`~deepinfer.backends.torch_ref.TorchBackend` in ``Sm100Backend``'s
bases, so its ``moe_route`` falls back to the reference's. Like the backend module it imports
no kernel module at import time (Triton may be missing where the registry loads it).
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor


class MoeOps:
    """``moe_route``, ``swiglu_mlp``, ``moe_experts``, ``moe_experts_shared`` and
    ``moe_experts_fp4`` on NVIDIA GPUs."""

    fuses_shared_expert: ClassVar[bool] = True

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
        from deepinfer_kernels_sm100.router import fits, route

        kw = {
            "topk": topk,
            "scoring_func": scoring_func,
            "routed_scaling_factor": routed_scaling_factor,
            "norm_topk_prob": norm_topk_prob,
            "fixed_indices": fixed_indices,
        }
        if not fits(gate_weight.shape[0], topk, scoring_func):
            return super().moe_route(x, gate_weight, bias, **kw)  # type: ignore[misc]
        # the gate's fp32 matmul (on tensor cores where held in bf16); the rest in one kernel
        return route(self.linear_fp32(x, gate_weight), bias, **kw)  # type: ignore[attr-defined]

    def swiglu_mlp(
        self, x: Tensor, w1: Tensor, w2: Tensor, w3: Tensor, swiglu_limit: float
    ) -> Tensor:
        from deepinfer_kernels_sm100.elementwise import swiglu

        x = x.to(w1.dtype)
        h = swiglu(F.linear(x, w1), F.linear(x, w3), swiglu_limit, w2.dtype)
        return F.linear(h, w2).float()

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
        from deepinfer_kernels_sm100.moe import moe_experts

        return moe_experts(
            x, weights, indices, w13=w13, w2=w2, swiglu_limit=swiglu_limit,
            residual=residual, out_dtype=out_dtype,
        )  # fmt: skip

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
        from deepinfer_kernels_sm100.fp4_moe import moe_experts_fp4

        return moe_experts_fp4(
            x, weights, indices, w13_packed=w13, w13_scale=w13_scale, w2_packed=w2,
            w2_scale=w2_scale, swiglu_limit=swiglu_limit, scales_fit=scales_fit,
            residual=residual, out_dtype=out_dtype,
        )  # fmt: skip

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
        """The shared expert as the grouped kernels' last slot where a step's rows fit a few of
        their tiles (:func:`~deepinfer_kernels_sm100.moe.fuses_shared`); a longer chunk's as
        dense GEMMs beside them (the reference's composition), whose tiles suit its rows."""
        from deepinfer_kernels_sm100.moe import fuses_shared, moe_experts

        if not fuses_shared(x.shape[0], indices.shape[1], w13.shape[0], w13.dtype):
            # gate and up as one GEMM of the fused weight, its halves read in place; the
            # output in the weights' dtype, widened where the slot sum adds it
            from deepinfer_kernels_sm100.elementwise import swiglu

            i = shared_w13.shape[0] // 2
            gate_up = F.linear(x.to(shared_w13.dtype), shared_w13)
            h = swiglu(gate_up[:, :i], gate_up[:, i:], swiglu_limit, shared_w2.dtype)
            return self.moe_experts(
                x, weights, indices, w13=w13, w2=w2, swiglu_limit=swiglu_limit,
                residual=F.linear(h, shared_w2), out_dtype=out_dtype,
            )  # fmt: skip
        return moe_experts(
            x, weights, indices, w13=w13, w2=w2, swiglu_limit=swiglu_limit,
            out_dtype=out_dtype, shared=(shared_w13, shared_w2),
        )  # fmt: skip
