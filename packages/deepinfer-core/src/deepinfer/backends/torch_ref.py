"""The torch reference backend: every op in plain torch.

It is the CPU default and the numeric reference that every accelerated kernel is tested against.
It also runs on a CUDA device (plain torch ops), which is how kernel packages inherit the ops they
do not accelerate.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from deepinfer.backends.base import Availability, Backend
from deepinfer.cache.pages import PagedEntries, dense_entries

#: Largest score tensor (elements) the reference materialises at once; longer prefills are
#: processed in query blocks so a long prompt does not need O(S^2 * heads) memory.
MAX_SCORE_ELEMENTS = 1 << 28
#: On a CPU the blocks are kept to what stays in cache (4 MiB of fp32): the indexer's and
#: attention's [rows, heads, keys] intermediates are written and read again at once, and a
#: 2048-token prefill of the tiny model ran 1.8x faster with these than with memory-sized ones.
CPU_SCORE_ELEMENTS = 1 << 20


def _rows_per_chunk(elements_per_row: int, rows: int, device: torch.device) -> int:
    limit = MAX_SCORE_ELEMENTS
    if device.type == "cpu":
        limit = min(limit, CPU_SCORE_ELEMENTS)
    return max(1, min(rows, limit // max(1, elements_per_row)))


def stable_topk(scores: Tensor, k: int) -> Tensor:
    """Indices of the ``k`` largest ``scores`` along the last dim, ties to the lowest index:
    exactly the first k of a stable descending sort, without sorting all of them.

    Each float is mapped to an int32 of the same order (negatives' magnitude bits flipped;
    -0.0 first made +0.0 so equal zeros tie) and joined with its reversed index into one int64
    key, which ``topk`` ranks (128 decode rows x 4096 entries, k = 16: 3 ms vs 24 ms on a CPU).
    """
    s = scores.float() + 0.0
    bits = s.view(torch.int32)
    ordered = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    t = s.shape[-1]
    low = (t - 1) - torch.arange(t, device=s.device, dtype=torch.int64)
    return torch.topk((ordered.to(torch.int64) << 32) | low, k, dim=-1).indices


GroupedMM = Callable[..., Tensor]
_GROUPED_MM: dict[tuple[str, torch.dtype], GroupedMM | None] = {}


def _grouped_mm_for(device: torch.device, dtype: torch.dtype) -> GroupedMM | None:
    """torch's grouped matmul if it runs for this device and dtype here, else None.

    It is new (public as ``F.grouped_mm`` from torch 2.10) and its kernels cover only some
    device/dtype pairs (CUDA wants bf16 on Hopper), so one tiny call decides, once per pair;
    without it the experts run one matmul each.
    """
    key = (device.type, dtype)
    if key not in _GROUPED_MM:
        fn = getattr(F, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)
        if fn is not None:
            try:
                a = torch.ones(4, 16, dtype=dtype, device=device)
                b = torch.ones(2, 16, 16, dtype=dtype, device=device)
                ends = torch.tensor([1, 4], dtype=torch.int32, device=device)
                got = fn(a, b.transpose(1, 2), offs=ends)
                fn = fn if bool((got.float() == 16).all()) else None
            except (RuntimeError, NotImplementedError, TypeError):
                fn = None
        _GROUPED_MM[key] = fn
    return _GROUPED_MM[key]


def group_by_expert(
    weights: Tensor, indices: Tensor, num_experts: int
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Group the (token, slot) pairs of a routing by expert, without a host sync.

    Returns (token row of each sorted pair [P], the sort order [P], each expert's end offset
    in the sorted pairs [E] int32, the router weights [P, 1] fp32, which sorted pairs have an
    expert [P]). The sort is stable: within an expert, pairs keep their (token, slot) order.
    "No expert" (-1) pairs sort after every expert's group, outside every offset, so grouped
    matmuls skip them.
    """
    k = indices.shape[-1]
    flat = indices.reshape(-1)
    key = torch.where(flat >= 0, flat, num_experts)
    order = key.argsort(stable=True)
    ordered = key[order]
    # Group ends by binary search in the sorted keys: unlike bincount, no host sync.
    experts = torch.arange(num_experts, device=indices.device, dtype=ordered.dtype)
    ends = torch.searchsorted(ordered, experts, right=True).to(torch.int32)
    scale = weights.reshape(-1)[order, None].float()
    return order // k, order, ends, scale, ordered < num_experts


def sort_by_expert(
    x: Tensor, weights: Tensor, indices: Tensor, w13: Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """:func:`group_by_expert` and the inputs of the sorted pairs [P, d] in the weights' dtype:
    (rows, order, ends, inputs, router weights, live)."""
    rows, order, ends, scale, live = group_by_expert(weights, indices, w13.shape[0])
    return rows, order, ends, x[rows].to(w13.dtype), scale, live


def combine_slots(y: Tensor, order: Tensor, live: Tensor, k: int) -> Tensor:
    """Sum the expert outputs of each token [P, d] (sorted pairs) -> [N, d], in slot order.

    Pairs without an expert contribute zero (their rows were never computed). The sum runs
    over each token's k slots in a fixed order, so it is deterministic on any device.
    """
    y = torch.where(live[:, None], y, 0.0)
    per_slot = torch.empty_like(y).index_copy_(0, order, y)
    return per_slot.view(-1, k, y.shape[-1]).sum(dim=1)


def sinkhorn(logits: Tensor, iters: int, eps: float) -> Tensor:
    """Project [..., n, n] logits towards a doubly-stochastic matrix (softmax, then alternate
    column/row normalisation): part of ``mhc_pre``, not an op of its own."""
    comb = torch.softmax(logits.float(), dim=-1) + eps
    comb = comb / (comb.sum(dim=-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        comb = comb / (comb.sum(dim=-1, keepdim=True) + eps)
        comb = comb / (comb.sum(dim=-2, keepdim=True) + eps)
    return comb


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

    def grouped_linear(self, x: Tensor, weight: Tensor) -> Tensor:
        groups, width = x.shape[-2], x.shape[-1]
        w = weight.view(groups, -1, width)  # [g, o, i]
        return torch.einsum("...gi,goi->...go", x.to(weight.dtype), w)

    def rms_norm(self, x: Tensor, weight: Tensor | None, eps: float) -> Tensor:
        xf = x.float()
        y = xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps)
        if weight is not None:
            y = weight.float() * y
        return y.to(x.dtype)

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
        kvf = kv.float()
        logits = torch.einsum("bshd,bld->bhsl", q.float(), kvf) * scale
        logits = logits.masked_fill(~mask[:, None], float("-inf"))
        sink = sinks.float().view(1, h, 1, 1).expand(b, h, s, 1)
        probs = torch.softmax(torch.cat((logits, sink), dim=-1), dim=-1)[..., :-1]
        return torch.einsum("bhsl,bld->bshd", probs, kvf).to(q.dtype)

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
        batch = torch.arange(b, device=kv.device)[:, None, None]
        keys = kv[batch, index.clamp(min=0)].float()  # [B, S, K, D]
        logits = torch.matmul(q.float(), keys.transpose(-1, -2)) * scale  # [B, S, H, K]
        logits = logits.masked_fill((index < 0)[:, :, None], float("-inf"))
        sink = sinks.float().view(1, 1, h, 1).expand(b, s, h, 1)
        probs = torch.softmax(torch.cat((logits, sink), dim=-1), dim=-1)[..., :-1]
        return torch.matmul(probs, keys).to(q.dtype)

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
    ) -> Tensor:
        if overlap:
            dim = kv.shape[-1] // 2
            b, _, r, _ = kv.shape
            # First half of each window feeds the next entry; window -1 gets weight 0 when absent.
            first_kv = kv[..., :dim]
            first_sc = score[..., :dim]
            if prev_kv is None or prev_score is None:
                prev_kv = kv.new_zeros(b, r, dim)
                prev_score = score.new_full((b, r, dim), float("-inf"))
            shifted_kv = torch.cat((prev_kv[:, None].to(kv.dtype), first_kv[:, :-1]), dim=1)
            shifted_sc = torch.cat((prev_score[:, None].to(score.dtype), first_sc[:, :-1]), dim=1)
            kv = torch.cat((shifted_kv, kv[..., dim:]), dim=2)
            score = torch.cat((shifted_sc, score[..., dim:]), dim=2)
        weights = torch.softmax(score.float(), dim=2)
        return (weights * kv.float()).sum(dim=2)

    def indexer_topk(
        self,
        q: Tensor,
        keys: Tensor | PagedEntries,
        weights: Tensor,
        n_visible: Tensor,
        topk: int,
    ) -> Tensor:
        b, s = q.shape[:2]
        t = keys.shape[1]
        k = min(topk, t)
        if k == 0:
            return torch.empty(b, s, 0, dtype=torch.long, device=q.device)
        rows = _rows_per_chunk(b * q.shape[2] * t, s, q.device)
        if rows < s:  # bound the [B, S, heads, T] score tensor
            return torch.cat(
                [
                    self.indexer_topk(
                        q[:, i : i + rows],
                        keys,
                        weights[:, i : i + rows],
                        n_visible[..., i : i + rows],
                        topk,
                    )
                    for i in range(0, s, rows)
                ],
                dim=1,
            )
        scores = self.indexer_scores(q, keys, weights)  # [B, S, T]
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

    def indexer_scores(self, q: Tensor, keys: Tensor | PagedEntries, weights: Tensor) -> Tensor:
        keys = dense_entries(keys)
        b, s = q.shape[:2]
        rows = _rows_per_chunk(b * q.shape[2] * keys.shape[1], s, q.device)
        if rows < s:  # bound the [B, S, heads, T] score tensor
            return torch.cat(
                [
                    self.indexer_scores(q[:, i : i + rows], keys, weights[:, i : i + rows])
                    for i in range(0, s, rows)
                ],
                dim=1,
            )
        dots = torch.einsum("bshc,btc->bsht", q.float(), keys.float()).relu()
        return (dots * weights.float()[..., None]).sum(dim=2)

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
        n = x.shape[-2]
        mix = self.hc_mix(x, fn, norm_eps)
        base = base.float()
        scale = scale.float()
        pre = torch.sigmoid(mix[..., :n] * scale[0] + base[:n]) + hc_eps
        post = 2 * torch.sigmoid(mix[..., n : 2 * n] * scale[1] + base[n : 2 * n])
        comb_logits = mix[..., 2 * n :] * scale[2] + base[2 * n :]
        comb = sinkhorn(comb_logits.unflatten(-1, (n, n)), sinkhorn_iters, hc_eps)
        return pre, post, comb

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
        logits = F.linear(x.float(), gate_weight.float())
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
    ) -> Tensor:
        rows, order, ends, xs, scale, live = sort_by_expert(x, weights, indices, w13)
        y = None
        grouped = _grouped_mm_for(x.device, w13.dtype)
        if grouped is not None:
            try:
                gate, up = grouped(xs, w13.transpose(1, 2), offs=ends).chunk(2, dim=-1)
                h = self._clamped_swiglu(gate, up, swiglu_limit) * scale  # scaled before w2
                y = grouped(h.to(w2.dtype), w2.transpose(1, 2), offs=ends).float()
            except RuntimeError as exc:  # e.g. a CUDA kernel's alignment rule on these dims
                _GROUPED_MM[(x.device.type, w13.dtype)] = None
                warnings.warn(
                    f"grouped matmul failed for experts {tuple(w13.shape)} on {x.device} "
                    f"({exc}); running one matmul per expert from now on",
                    RuntimeWarning,
                    stacklevel=2,
                )
        if y is None:
            y = torch.zeros(len(rows), x.shape[-1], dtype=torch.float32, device=x.device)
            start = 0
            for e, stop in enumerate(ends.tolist()):
                if stop > start:
                    part = slice(start, stop)
                    gate, up = F.linear(xs[part], w13[e]).chunk(2, dim=-1)
                    h = self._clamped_swiglu(gate, up, swiglu_limit) * scale[part]
                    y[part] = F.linear(h.to(w2.dtype), w2[e]).float()
                start = stop
        return combine_slots(y, order, live, indices.shape[-1])

    def swiglu_mlp(
        self, x: Tensor, w1: Tensor, w2: Tensor, w3: Tensor, swiglu_limit: float
    ) -> Tensor:
        x = x.to(w1.dtype)
        h = self._clamped_swiglu(F.linear(x, w1), F.linear(x, w3), swiglu_limit)
        return F.linear(h.to(w2.dtype), w2).float()
