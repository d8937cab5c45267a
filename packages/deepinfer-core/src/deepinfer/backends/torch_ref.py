"""The torch reference backend: every op in plain torch.

The CPU default and the numeric reference every accelerated kernel is tested against; it also
runs on CUDA (plain torch ops), so kernel packages inherit the ops they do not accelerate.

This module keeps the op dispatch, the blocking of long prefills and the top-k picks. Op
families' maths live apart, readable (and reused) without the backend: ``attention_ref``
(sink attention, indexer scores, KV compression), ``moe_ref`` (expert grouping and matmuls),
``mhc_ref`` (hyper-connection weights, Sinkhorn), ``fp8_ref`` (FP8 block-scaled projections).
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from deepinfer.backends.attention_ref import (
    indexer_dot_scores,
    pool_windows,
    sink_attention,
    sparse_sink_attention,
)
from deepinfer.backends.base import Availability, Backend, Fp8Activation, Fp8Output
from deepinfer.backends.fp4_ref import dequant_fp4
from deepinfer.backends.fp8_ref import fp8_grouped, fp8_linear_ref, quantize_act_fp8
from deepinfer.backends.grouped_ref import grouped_linear
from deepinfer.backends.mhc_ref import mhc_weights_from_mix
from deepinfer.backends.moe_ref import (
    add_residual,
    combine_slots,
    expert_outputs,
    sort_by_expert,
)
from deepinfer.backends.topk_ref import stable_topk
from deepinfer.paging import PagedEntries, dense_entries

#: Largest score tensor (elements) the reference materialises at once; longer prefills are
#: processed in query blocks so a long prompt does not need O(S^2 * heads) memory.
MAX_SCORE_ELEMENTS = 1 << 28
#: On a CPU the blocks are kept to what stays in cache (4 MiB of fp32): the indexer's and
#: attention's [rows, heads, keys] intermediates are written and read again at once, and a
#: 2048-token prefill of the tiny model ran 1.8x faster with these than with memory-sized ones.
CPU_SCORE_ELEMENTS = 1 << 20


def _rows_per_chunk(elements_per_row: int, rows: int, device: torch.device) -> int:
    """Query rows per block so one block's score tensor stays within the limits above (read
    from this module's globals at each call, so tests can shrink them to force blocking)."""
    limit = MAX_SCORE_ELEMENTS
    if device.type == "cpu":
        limit = min(limit, CPU_SCORE_ELEMENTS)
    return max(1, min(rows, limit // max(1, elements_per_row)))


class TorchBackend(Backend):
    """Plain-torch ops on any device torch itself supports."""

    name: ClassVar[str] = "torch"
    device_types: ClassVar[tuple[str, ...]] = ("cpu", "cuda")

    @classmethod
    def availability(cls) -> Availability:
        return Availability(True)

    # -- dense algebra --------------------------------------------------------------------------

    def linear(self, x: Tensor, weight: Tensor) -> Tensor:
        return F.linear(x.to(weight.dtype), weight)

    def linear_fp32(self, x: Tensor, weight: Tensor) -> Tensor:
        return F.linear(x.float(), weight.float())

    def fp8_linear(
        self,
        x: Tensor,
        weight: Tensor,
        scale: Tensor,
        block: tuple[int, int],
        x_fp8: Fp8Activation | None = None,
    ) -> Tensor:
        return fp8_linear_ref(x, weight, scale, block, x_fp8)

    def fp8_grouped_linear(
        self, x: Tensor, weight: Tensor, scale: Tensor, block: tuple[int, int]
    ) -> Tensor:
        return fp8_grouped(self.fp8_linear, x, weight, scale, block)

    def swiglu(self, gate: Tensor, up: Tensor, swiglu_limit: float) -> Tensor:
        return self._clamped_swiglu(gate, up, swiglu_limit).to(gate.dtype)

    def swiglu_fp8(self, gate: Tensor, up: Tensor, swiglu_limit: float) -> Fp8Output:
        h = self.swiglu(gate, up, swiglu_limit)
        return h, Fp8Activation(*quantize_act_fp8(h))

    def grouped_linear(self, x: Tensor, weight: Tensor) -> Tensor:
        return grouped_linear(x, weight)

    def rms_norm(self, x: Tensor, weight: Tensor | None, eps: float) -> Tensor:
        xf = x.float()
        y = xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps)
        if weight is not None:
            y = weight.float() * y
        return y.to(x.dtype)

    def rms_norm_fp8(self, x: Tensor, weight: Tensor, eps: float) -> Fp8Output:
        y = self.rms_norm(x, weight, eps)
        return y, Fp8Activation(*quantize_act_fp8(y))

    def rope(self, x: Tensor, cos: Tensor, sin: Tensor, inverse: bool = False) -> Tensor:
        rd = 2 * cos.shape[-1]
        nope, rot = x[..., :-rd], x[..., -rd:].float()
        even, odd = rot[..., 0::2], rot[..., 1::2]
        c = cos.float()[..., None, :]  # [(B,) S, 1, r/2] broadcasts over heads
        s = sin.float()[..., None, :]
        if inverse:
            s = -s
        out = torch.stack((even * c - odd * s, even * s + odd * c), dim=-1).flatten(-2)
        return torch.cat((nope, out.to(x.dtype)), dim=-1)

    # -- attention ----------------------------------------------------------------------------

    def attention(self, q: Tensor, kv: Tensor, mask: Tensor, sinks: Tensor, scale: float) -> Tensor:
        b, s, h, _ = q.shape
        rows = _rows_per_chunk(b * h * kv.shape[1], s, q.device)
        if rows < s:  # long prefill: bound the [B, H, S, L] score tensor
            return torch.cat(
                [
                    self.attention(q[:, i : i + rows], kv, mask[:, i : i + rows], sinks, scale)
                    for i in range(0, s, rows)
                ],
                dim=1,
            )
        return sink_attention(q, kv, mask, sinks, scale)

    def sparse_attention(
        self, q: Tensor, kv: Tensor, index: Tensor, sinks: Tensor, scale: float
    ) -> Tensor:
        b, s, h, d = q.shape
        k = index.shape[-1]
        # Each query's keys are gathered ([rows, K, D]): blocks of rows keep that within the
        # score bound.
        rows = _rows_per_chunk(b * k * max(h, d), s, q.device)
        if rows < s:
            return torch.cat(
                [
                    self.sparse_attention(
                        q[:, i : i + rows], kv, index[:, i : i + rows], sinks, scale
                    )
                    for i in range(0, s, rows)
                ],
                dim=1,
            )
        return sparse_sink_attention(q, kv, index, sinks, scale)

    def sampling_uniform(
        self, seeds: Tensor, positions: Tensor, width: int, stream: int = 0
    ) -> Tensor:
        from deepinfer.sampling import rng

        return rng.sampling_uniform(seeds, positions, width, stream)

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
        return pool_windows(kv, score, prev_kv, prev_score, overlap).to(dtype)

    def indexer_topk(  # noqa: PLR0917
        self,
        q: Tensor,
        keys: Tensor | PagedEntries,
        weights: Tensor,
        n_visible: Tensor,
        topk: int,
        weight_scale: float = 1.0,
    ) -> Tensor:
        b, s = q.shape[:2]
        t = keys.shape[1]
        k = min(topk, t)
        if k == 0:
            return torch.empty(b, s, 0, dtype=torch.long, device=q.device)
        rows = _rows_per_chunk(b * q.shape[2] * t, s, q.device)
        if rows < s:  # bound the [B, S, heads, T] score tensor
            part = [slice(i, i + rows) for i in range(0, s, rows)]
            return torch.cat(
                [
                    self.indexer_topk(
                        q[:, p], keys, weights[:, p], n_visible[..., p], topk, weight_scale
                    )
                    for p in part
                ],
                dim=1,
            )
        scores = self.indexer_scores(q, keys, weights, weight_scale)  # [B, S, T]
        return self.topk_picks(scores, k, n_visible=n_visible.to(q.device))

    def topk_picks(
        self,
        scores: Tensor,
        k: int,
        *,
        n_visible: Tensor | None = None,
        allowed: Tensor | None = None,
    ) -> Tensor:
        # ReLU scores tie often (exact zeros). Ties resolve to the lowest entry, so the picks
        # never depend on how many masked entries follow (a plain topk's choice among equal
        # values changes with the length, e.g. when a captured step reads a full-capacity
        # entry buffer).
        if n_visible is not None:
            entry = torch.arange(scores.shape[-1], device=scores.device)
            n_visible = n_visible[..., None]  # [S, 1] or [B, S, 1]
            idx = stable_topk(scores.masked_fill(entry >= n_visible, float("-inf")), k)
            return torch.where(idx >= n_visible, torch.full_like(idx, -1), idx)
        if allowed is None:
            return stable_topk(scores, k)
        idx = stable_topk(scores.masked_fill(~allowed, float("-inf")), k)
        ok = allowed.expand(scores.shape).gather(-1, idx)
        return torch.where(ok, idx, torch.full_like(idx, -1))

    def indexer_scores(
        self, q: Tensor, keys: Tensor | PagedEntries, weights: Tensor, weight_scale: float = 1.0
    ) -> Tensor:
        keys = dense_entries(keys)
        b, s = q.shape[:2]
        rows = _rows_per_chunk(b * q.shape[2] * keys.shape[1], s, q.device)
        if rows < s:  # bound the [B, S, heads, T] score tensor
            part = [slice(i, i + rows) for i in range(0, s, rows)]
            scores = [self.indexer_scores(q[:, p], keys, weights[:, p], weight_scale) for p in part]
            return torch.cat(scores, dim=1)
        return indexer_dot_scores(q, keys, weights, weight_scale)

    def engram_gate(
        self, h: Tensor, key: Tensor, q_weight: Tensor, k_weight: Tensor, eps: float
    ) -> Tensor:
        hf, kf = h.float(), key.float()
        hn = hf * torch.rsqrt(hf.square().mean(-1, keepdim=True) + eps) * q_weight.float()
        kn = kf * torch.rsqrt(kf.square().mean(-1, keepdim=True) + eps) * k_weight.float()
        dot = (hn * kn).sum(-1) / math.sqrt(h.shape[-1])
        return torch.sigmoid(dot.sign() * dot.abs().clamp_min(1e-6).sqrt())

    # -- mHC ------------------------------------------------------------------------------------

    def hc_mix(self, x: Tensor, fn: Tensor, norm_eps: float) -> Tensor:
        flat = x.flatten(-2).float()
        flat = flat * torch.rsqrt(flat.square().mean(-1, keepdim=True) + norm_eps)
        return F.linear(flat, fn.float())

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
        pre, post, comb = self.mhc_weights(
            x, fn, base, scale, norm_eps=norm_eps, hc_eps=hc_eps, sinkhorn_iters=sinkhorn_iters
        )
        return self.mhc_collapse(x, pre), post, comb

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
        mix = self.hc_mix(x, fn, norm_eps)
        return mhc_weights_from_mix(
            mix, base, scale, hc=x.shape[-2], hc_eps=hc_eps, sinkhorn_iters=sinkhorn_iters
        )

    def mhc_collapse(self, x: Tensor, pre: Tensor) -> Tensor:
        return (pre.float()[..., None] * x.float()).sum(dim=-2).to(x.dtype)

    def mhc_post(self, y: Tensor, x: Tensor, post: Tensor, comb: Tensor) -> Tensor:
        dt = x.dtype
        mixed = torch.matmul(comb.to(dt).transpose(-1, -2), x)
        return post.to(dt)[..., None] * y.to(dt)[..., None, :] + mixed

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
        mix = self.hc_mix(x, fn, norm_eps)
        pre = torch.sigmoid(mix * scale.float() + base.float()) + hc_eps
        return self.mhc_collapse(x, pre)

    # -- MoE ------------------------------------------------------------------------------------

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
        logits = self.linear_fp32(x, gate_weight)
        if scoring_func == "sqrtsoftplus":
            scores = F.softplus(logits).sqrt()
        elif scoring_func == "sigmoid":
            scores = logits.sigmoid()
        elif scoring_func == "softmax":
            scores = logits.softmax(dim=-1)
        else:
            raise NotImplementedError(f"router scoring_func={scoring_func!r}")
        if fixed_indices is not None:
            indices = fixed_indices.long()
        else:
            biased = scores if bias is None else scores + bias.float()
            indices = biased.topk(topk, dim=-1).indices
        weights = scores.gather(-1, indices)
        if norm_topk_prob:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return weights * routed_scaling_factor, indices

    @staticmethod
    def _clamped_swiglu(gate: Tensor, up: Tensor, limit: float) -> Tensor:
        gate, up = gate.float(), up.float()
        if limit > 0:
            gate = gate.clamp(max=limit)
            up = up.clamp(min=-limit, max=limit)
        return F.silu(gate) * up

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
        _, order, ends, xs, scale, live = sort_by_expert(x, weights, indices, w13)
        # The activation is passed as this backend's method: subclasses may override it.
        y = expert_outputs(
            xs, ends, scale, w13=w13, w2=w2, swiglu_limit=swiglu_limit,
            activation=self._clamped_swiglu,
        )  # fmt: skip
        return add_residual(combine_slots(y, order, live, indices.shape[-1]), residual, out_dtype)

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
        w13 = dequant_fp4(w13, w13_scale, x.dtype)
        w2 = dequant_fp4(w2, w2_scale, x.dtype)
        return self.moe_experts(
            x, weights, indices, w13=w13, w2=w2, swiglu_limit=swiglu_limit,
            residual=residual, out_dtype=out_dtype,
        )  # fmt: skip

    def swiglu_mlp(
        self, x: Tensor, w1: Tensor, w2: Tensor, w3: Tensor, swiglu_limit: float
    ) -> Tensor:
        x = x.to(w1.dtype)
        h = self._clamped_swiglu(F.linear(x, w1), F.linear(x, w3), swiglu_limit)
        return F.linear(h.to(w2.dtype), w2).float()
