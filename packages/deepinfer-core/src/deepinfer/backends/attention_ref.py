"""Attention maths of the torch reference, one block of query rows at a time.

DeepSeek V4's compressed sparse attention has four numeric pieces: the KV compressor's softmax
pooling of token windows into entries, the lightning indexer's scores that pick the entries
each query reads, and shared-KV multi-query attention with a per-head sink logit, either over a
mask (dense) or over a list of key rows (sparse).

They live here, apart from :class:`~deepinfer.backends.torch_ref.TorchBackend`, so that the
formulas read on their own. The backend keeps the splitting of long prefills into blocks of
query rows (whose size tests shrink through ``torch_ref.MAX_SCORE_ELEMENTS``) and calls these
on each block; nothing here bounds memory.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from deepinfer.paging import KeyPages


def sink_attention(q: Tensor, kv: Tensor, mask: Tensor, sinks: Tensor, scale: float) -> Tensor:
    """``Backend.attention`` in fp32: ``q`` [B, S, H, D], ``kv`` [B, L, D], ``mask`` [B, S, L]
    -> [B, S, H, D] in ``q``'s dtype; the sink joins the softmax denominator only."""
    b, s, h, _ = q.shape
    kvf = kv.float()
    logits = torch.einsum("bshd,bld->bhsl", q.float(), kvf) * scale
    logits = logits.masked_fill(~mask[:, None], float("-inf"))
    sink = sinks.float().view(1, h, 1, 1).expand(b, h, s, 1)
    probs = torch.softmax(torch.cat((logits, sink), dim=-1), dim=-1)[..., :-1]
    return torch.einsum("bhsl,bld->bshd", probs, kvf).to(q.dtype)


def gathered_attention(
    attention: Callable[[Tensor, Tensor, Tensor, Tensor, float], Tensor],
    q: Tensor,
    sources: Sequence[KeyPages],
    sinks: Tensor,
    scale: float,
) -> Tensor:
    """``Backend.paged_attention`` as copies: every source's listed entries gathered into one
    key tensor [B, K, D] in the first pool's dtype, masked where none, for ``attention``."""
    dtype = sources[0].pool.dtype
    keys = [_take_rows(s.pool.flatten(0, 1), s.rows()).to(dtype) for s in sources]
    mask = torch.cat([s.entries >= 0 for s in sources], dim=-1)
    return attention(q, torch.cat(keys, dim=1), mask, sinks, scale)


def sparse_sink_attention(
    q: Tensor, kv: Tensor, index: Tensor, sinks: Tensor, scale: float
) -> Tensor:
    """``Backend.sparse_attention`` in fp32: each query's listed ``kv`` rows (``index``
    [B, S, K], -1 = none) are gathered into [B, S, K, D] and attended like a mask would."""
    b, s, h, _ = q.shape
    batch = torch.arange(b, device=kv.device)[:, None, None] * kv.shape[1]
    keys = _take_rows(kv.flatten(0, 1), index.clamp(min=0) + batch).float()  # [B, S, K, D]
    logits = torch.matmul(q.float(), keys.transpose(-1, -2)) * scale  # [B, S, H, K]
    logits = logits.masked_fill((index < 0)[:, :, None], float("-inf"))
    sink = sinks.float().view(1, 1, h, 1).expand(b, s, h, 1)
    probs = torch.softmax(torch.cat((logits, sink), dim=-1), dim=-1)[..., :-1]
    return torch.matmul(probs, keys).to(q.dtype)


def _take_rows(table: Tensor, rows: Tensor) -> Tensor:
    """``table[rows]`` for a 2-D ``table`` as one ``index_select``: whole rows at a time,
    several times faster on a CPU than advanced indexing, which goes element by element."""
    return table.index_select(0, rows.flatten()).view(*rows.shape, table.shape[-1])


def pool_windows(
    kv: Tensor,
    score: Tensor,
    prev_kv: Tensor | None,
    prev_score: Tensor | None,
    overlap: bool,
) -> Tensor:
    """``Backend.compress``: softmax-pool each window's rows [B, n, r, c*D] -> [B, n, D] fp32;
    with ``overlap`` an entry pools the first half of the window before it and its own second
    half (``prev_*`` [B, r, D]: the window before the first; None: weight 0)."""
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


def indexer_dot_scores(
    q: Tensor, keys: Tensor, weights: Tensor, weight_scale: float = 1.0
) -> Tensor:
    """``Backend.indexer_scores`` on dense keys: ``sum_h w * relu(q . k)``, ``q``
    [B, S, h, c], ``keys`` [B, T, c], ``w`` = ``weights`` [B, S, h] in fp32 times
    ``weight_scale`` -> [B, S, T] fp32."""
    dots = torch.einsum("bshc,btc->bsht", q.float(), keys.float()).relu()
    w = weights.float() if weight_scale == 1.0 else weights.float() * weight_scale
    return (dots * w[..., None]).sum(dim=2)
