"""The NVIDIA backend.

Every op is inherited from the torch reference, which already runs on CUDA; Triton kernels replace
ops one at a time, each tested against the reference it overrides. The same Triton code is compiled
for Blackwell (sm_100a) and Hopper (sm_90), so both are accepted.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from deepinfer.backends.base import Availability, Fp8Activation, Fp8Output
from deepinfer.backends.compress_ref import WindowBuffers
from deepinfer.backends.compress_verify_ref import VerifyPlan
from deepinfer.backends.torch_ref import TorchBackend
from deepinfer.paging import KeyPages, PagedEntries
from deepinfer_kernels_sm100.moe_ops import MoeOps

MIN_CAPABILITY: tuple[int, int] = (9, 0)

#: fp32 products that cuBLAS runs with a far slower kernel than for a few rows fewer or more
#: (``benchmarks/fp32_linear_rows.py``, on the embedded tiny model's shapes): rows in
#: ``FP32_SLOW_ROWS`` (inclusive) by a weight of at least ``FP32_SLOW_MIN_IN`` columns and
#: ``FP32_SLOW_OUT`` rows (inclusive); their rows are padded to ``FP32_PADDED_ROWS``. Narrower
#: or much taller weights ran as fast there unpadded, so they keep the plain product.
FP32_SLOW_ROWS = (7, 16)
FP32_SLOW_MIN_IN = 128
FP32_SLOW_OUT = (128, 1024)
FP32_PADDED_ROWS = 24


def pads_fp32_rows(rows: int, weight: Tensor) -> bool:
    """Whether ``linear`` pads an fp32 product of ``rows`` rows by ``weight`` (see above)."""
    out, width = weight.shape
    return (
        weight.dtype == torch.float32
        and FP32_SLOW_ROWS[0] <= rows <= FP32_SLOW_ROWS[1]
        and width >= FP32_SLOW_MIN_IN
        and FP32_SLOW_OUT[0] <= out <= FP32_SLOW_OUT[1]
    )


class Sm100Backend(MoeOps, TorchBackend):
    """Triton kernels on NVIDIA Hopper and Blackwell GPUs; torch reference for the rest.

    The kernel modules are imported inside the ops: this module must import (for the plugin
    registry and the availability check) on machines where Triton is missing.
    """

    name: ClassVar[str] = "sm100"
    device_types: ClassVar[tuple[str, ...]] = ("cuda",)
    native_formats: ClassVar[frozenset[str]] = frozenset({"fp8", "fp4_experts", "bf16_projections"})
    fuse_projections: ClassVar[bool] = True

    @classmethod
    def availability(cls) -> Availability:
        if importlib.util.find_spec("triton") is None:
            return Availability(False, "triton is not installed: pip install 'deepinfer[sm100]'")
        if torch.version.cuda is None:
            return Availability(False, f"torch {torch.__version__} is a build without CUDA")
        if not torch.cuda.is_available():
            return Availability(False, "no NVIDIA GPU is visible to torch")
        cap = torch.cuda.get_device_capability(0)
        if cap < MIN_CAPABILITY:
            return Availability(
                False,
                f"{torch.cuda.get_device_name(0)} is sm_{cap[0]}{cap[1]}; "
                f"needs sm_{MIN_CAPABILITY[0]}{MIN_CAPABILITY[1]} (Hopper) or newer",
            )
        return Availability(True)

    def supports_cuda_graphs(self, dtype: Any) -> bool:
        return True  # every token-wise op is a kernel or a sync-free torch op

    def linear(self, x: Tensor, weight: Tensor) -> Tensor:
        """fp32 weights (a model built in fp32, as the embedded tiny model runs): the products
        of a few rows for which cuBLAS's fp32 GEMM picks a far slower kernel than for a few
        rows more (:func:`pads_fp32_rows`) get their rows padded; the result is the padded
        product's first rows, contiguous."""
        rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
        if not pads_fp32_rows(rows, weight):
            return super().linear(x, weight)
        flat = F.pad(x.reshape(rows, -1).to(weight.dtype), (0, 0, 0, FP32_PADDED_ROWS - rows))
        return F.linear(flat, weight)[:rows].view(*x.shape[:-1], weight.shape[0])

    def linear_fp32(self, x: Tensor, weight: Tensor) -> Tensor:
        from deepinfer_kernels_sm100.split_linear import linear_fp32

        return linear_fp32(x, weight)

    def fp8_linear(
        self,
        x: Tensor,
        weight: Tensor,
        scale: Tensor,
        block: tuple[int, int],
        x_fp8: Fp8Activation | None = None,
    ) -> Tensor:
        from deepinfer_kernels_sm100.fp8_linear import fp8_block_linear

        quantized = (x_fp8.q, x_fp8.scale) if x_fp8 is not None else None
        return fp8_block_linear(x, weight, scale, block, out_dtype=x.dtype, quantized=quantized)

    def fp8_grouped_linear(
        self, x: Tensor, weight: Tensor, scale: Tensor, block: tuple[int, int]
    ) -> Tensor:
        from deepinfer_kernels_sm100.fp8_linear import fp8_block_grouped_linear

        return fp8_block_grouped_linear(x, weight, scale, block, out_dtype=x.dtype)

    def swiglu(self, gate: Tensor, up: Tensor, swiglu_limit: float) -> Tensor:
        from deepinfer_kernels_sm100.elementwise import swiglu

        return swiglu(gate, up, swiglu_limit, gate.dtype)

    def swiglu_fp8(self, gate: Tensor, up: Tensor, swiglu_limit: float) -> Fp8Output:
        from deepinfer_kernels_sm100.elementwise import swiglu_fp8

        h, q, s = swiglu_fp8(gate, up, swiglu_limit, gate.dtype)
        return h, Fp8Activation(q, s)

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
    ) -> tuple[Tensor, Fp8Activation | None, Tensor, Tensor]:
        from deepinfer_kernels_sm100.mhc_fused import Normed, mhc_entry

        norm = Normed(weight, eps, fp8)
        entry = mhc_entry(x, fn, base, scale, norm_eps, hc_eps, sinkhorn_iters, True, norm)
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
    ) -> tuple[Tensor, Tensor, Tensor]:
        from deepinfer_kernels_sm100.mhc_fused import mhc_entry

        pre, post, comb, *_ = mhc_entry(x, fn, base, scale, norm_eps, hc_eps, sinkhorn_iters, False)
        return pre, post, comb

    def hc_mix(self, x: Tensor, fn: Tensor, norm_eps: float) -> Tensor:
        from deepinfer_kernels_sm100.mhc import hc_mix

        return hc_mix(x, fn, norm_eps)

    def mhc_collapse(self, x: Tensor, pre: Tensor) -> Tensor:
        from deepinfer_kernels_sm100.mhc import mhc_collapse

        return mhc_collapse(x, pre)

    def mhc_post(self, y: Tensor, x: Tensor, post: Tensor, comb: Tensor) -> Tensor:
        from deepinfer_kernels_sm100.mhc import mhc_post

        return mhc_post(y, x, post, comb)

    def rms_norm(self, x: Tensor, weight: Tensor | None, eps: float) -> Tensor:
        from deepinfer_kernels_sm100.elementwise import rms_norm

        return rms_norm(x, weight, eps)

    def rms_norm_fp8(self, x: Tensor, weight: Tensor, eps: float) -> Fp8Output:
        from deepinfer_kernels_sm100.elementwise import rms_norm_fp8

        y, q, s = rms_norm_fp8(x, weight, eps)
        return y, Fp8Activation(q, s)

    def rope(self, x: Tensor, cos: Tensor, sin: Tensor, inverse: bool = False) -> Tensor:
        from deepinfer_kernels_sm100.elementwise import rope

        return rope(x, cos, sin, inverse)

    def rms_norm_rope(
        self, x: Tensor, weight: Tensor | None, eps: float, cos: Tensor, sin: Tensor
    ) -> Tensor:
        from deepinfer_kernels_sm100.norm_rope import rms_norm_rope

        return rms_norm_rope(x, weight, eps, cos, sin)

    def rms_norm_rope_into(  # noqa: PLR0917
        self,
        x: Tensor,
        weight: Tensor | None,
        eps: float,
        cos: Tensor,
        sin: Tensor,
        pool: Tensor,
        rows: Tensor,
    ) -> None:
        if pool.dtype != x.dtype or not pool.is_contiguous() or x.shape[1:3] != (1, 1):
            return super().rms_norm_rope_into(x, weight, eps, cos, sin, pool, rows)
        from deepinfer_kernels_sm100.norm_rope import rms_norm_rope_into

        return rms_norm_rope_into(x, weight, eps, cos, sin, pool, rows)

    def attention(self, q: Tensor, kv: Tensor, mask: Tensor, sinks: Tensor, scale: float) -> Tensor:
        from deepinfer_kernels_sm100.attention import mqa_sink_attention

        return mqa_sink_attention(q, kv, mask, sinks, scale)

    def paged_attention(
        self,
        q: Tensor,
        sources: Sequence[KeyPages],
        sinks: Tensor,
        scale: float,
        derotate: tuple[Tensor, Tensor] | None = None,
    ) -> Tensor:
        from deepinfer_kernels_sm100.attention import paged_mqa_sink_attention

        return paged_mqa_sink_attention(q, sources, sinks, scale, derotate)

    def compress_slots(  # noqa: PLR0917
        self,
        kv: Tensor,
        score: Tensor,
        bias: Tensor | None,
        buffers: WindowBuffers,
        slots: Tensor,
        phase: Tensor,
        history_row: Tensor | None,
        overlap: bool,
        dtype: torch.dtype = torch.float32,
    ) -> Tensor:
        rows = (kv, score, bias, buffers, slots, phase, history_row)
        if buffers.ratio == 1:  # no open window to keep: the reference's few ops
            return super().compress_slots(*rows, overlap, dtype)
        from deepinfer_kernels_sm100.compress import slot_pool

        return slot_pool(*rows, overlap=overlap, dtype=dtype)

    def verify_plan(
        self, positions: Tensor, slots: Tensor, lengths: Tensor, ratio: int
    ) -> VerifyPlan:
        from deepinfer_kernels_sm100.verify_plan import verify_plan

        return verify_plan(positions, slots, lengths, ratio)

    def compress_verify(  # noqa: PLR0917
        self,
        kv: Tensor,
        score: Tensor,
        bias: Tensor | None,
        buffers: WindowBuffers,
        slots: Tensor,
        plan: VerifyPlan,
        overlap: bool,
        dtype: torch.dtype = torch.float32,
    ) -> Tensor:
        rows = (kv, score, bias, buffers, slots, plan)
        if buffers.ratio == 1:  # every token a whole window: the reference's few ops
            return super().compress_verify(*rows, overlap, dtype)
        from deepinfer_kernels_sm100.compress_verify import verify_pool

        return verify_pool(*rows, overlap=overlap, dtype=dtype)

    def compress(
        self,
        kv: Tensor,
        score: Tensor,
        prev_kv: Tensor | None,
        prev_score: Tensor | None,
        overlap: bool,
        *,
        dtype: torch.dtype = torch.float32,
    ) -> Tensor:
        from deepinfer_kernels_sm100.compress import softmax_pool

        return softmax_pool(kv, score, prev_kv, prev_score, overlap, dtype=dtype)

    def indexer_scores(
        self, q: Tensor, keys: Tensor | PagedEntries, weights: Tensor, weight_scale: float = 1.0
    ) -> Tensor:
        from deepinfer_kernels_sm100.indexer import dense_indexer_scores, paged_indexer_scores

        if not isinstance(keys, PagedEntries):  # a chunk's own keys: dense already
            return dense_indexer_scores(q, keys, weights, weight_scale=weight_scale)
        return paged_indexer_scores(q, keys, weights, weight_scale)

    def indexer_topk(  # noqa: PLR0917
        self,
        q: Tensor,
        keys: Tensor | PagedEntries,
        weights: Tensor,
        n_visible: Tensor,
        topk: int,
        weight_scale: float = 1.0,
    ) -> Tensor:
        """Dense keys (a prefill chunk's): scored in blocks of queries whose [rows, T] scores
        stay within ``MAX_DENSE_SCORES``, skipping keys no query of a block sees."""
        if isinstance(keys, PagedEntries):
            return super().indexer_topk(q, keys, weights, n_visible, topk, weight_scale)
        from deepinfer_kernels_sm100.indexer import MAX_DENSE_SCORES, dense_indexer_scores

        b, s, t = q.shape[0], q.shape[1], keys.shape[1]
        k = min(topk, t)
        if k == 0:
            return q.new_empty(b, s, 0, dtype=torch.long)
        rows = max(1, min(s, MAX_DENSE_SCORES // max(1, b * t)))
        picks = []
        for i in range(0, s, rows):
            part = slice(i, i + rows)
            seen = n_visible[..., part].to(q.device)
            scores = dense_indexer_scores(q[:, part], keys, weights[:, part], seen, weight_scale)
            picks.append(self.topk_picks(scores, k, n_visible=seen))
        return picks[0] if len(picks) == 1 else torch.cat(picks, dim=1)

    def topk_picks(
        self,
        scores: Tensor,
        k: int,
        *,
        n_visible: Tensor | None = None,
        allowed: Tensor | None = None,
    ) -> Tensor:
        from deepinfer_kernels_sm100.topk import fits, stable_topk_picks

        if not fits(k):
            return super().topk_picks(scores, k, n_visible=n_visible, allowed=allowed)
        return stable_topk_picks(scores, k, n_visible=n_visible, allowed=allowed)

    def sampling_uniform(
        self, seeds: Tensor, positions: Tensor, width: int, stream: int = 0
    ) -> Tensor:
        from deepinfer_kernels_sm100.sampling import sampling_uniform

        return sampling_uniform(seeds, positions, width, stream)

    def sparse_attention(
        self, q: Tensor, kv: Tensor, index: Tensor, sinks: Tensor, scale: float
    ) -> Tensor:
        from deepinfer_kernels_sm100 import attention_blocks
        from deepinfer_kernels_sm100.attention import sparse_mqa_sink_attention

        if attention_blocks.fits(q, index):  # a prefill chunk of few heads
            return attention_blocks.block_sparse_attention(q, kv, index, sinks, scale)
        return sparse_mqa_sink_attention(q, kv, index, sinks, scale)
