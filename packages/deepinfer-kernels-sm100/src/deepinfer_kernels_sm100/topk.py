"""Stable top-k picks of indexer scores: a segmented radix select, then a sort of the k picks.

The reference (:func:`deepinfer.backends.torch_ref.stable_topk`) maps each fp32 score to an int32
of the same order, joins it with the reversed entry id into one int64 key and asks ``torch.topk``
for the k largest keys: on a GPU a radix select over 64-bit keys (8 passes, three kernels each)
and a sort of the k, after half a dozen elementwise kernels that build the keys and mask the
entries a query may not see. In a captured 32k-token V4.1 decode step those made ~13% of the
GPU time.

Here every row is cut into segments, so that a few hundred programs run at once (a batch-1
decode step's single row spreads over the GPU too):

1. four histogram launches find the k-th largest 32-bit ordered score, 8 bits a pass: each
   segment adds its histogram of the entries that match the digits found so far to its row's
   (integer atomics: exact in any order);
2. two launches collect the picks, the entries above that threshold and the first ``rem`` equal
   to it in entry order (ties go to the lowest entry id, as the reference's reversed-id key
   makes them): one counts both per segment, the next writes each segment's picks after those
   of the segments before it, as the reference's int64 keys;
3. one program per row sorts its k keys, descending, and writes their entry ids, -1 for entries
   the row may not see.

Keys are unique, so the picks and their order equal the reference's bit for bit. Entries a
query may not see score -inf, as in the reference (they are picked only when fewer than k are
visible, and then written as -1).

A row of at most ``ROW_SORT_MAX`` entries (``ROW_SORT_MAX_MANY_ROWS`` where the rows alone fill
the GPU) is one program's instead: it sorts the row's keys in registers and writes the first k,
the same picks in the same order, in one launch for the seven above.

Where the rows alone fill the GPU (a prefill chunk's thousands of queries: one segment a row)
and a row has at most ``ROW_SELECT_MAX`` entries, one program a row runs steps 1 and 2 on the row's
keys held in registers: the four passes and the collection read the scores once, not six
times, and need no atomics (the program owns its row's histogram); step 3 follows.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

MAX_K = 4096  # the sorted keys of one row live in registers
# H200, 512 picks (benchmarks/README.md): 1024 x 8 warps beat 2048 x 8 and 1024 x 4 at 1-32 rows;
# 528 programs a pass beat 264 at 128 rows x 32k entries, and 132 lost there.
BLOCK = 1024  # entries a program reads at once
NUM_WARPS = 8
TARGET_PROGRAMS = 528  # programs a pass (four per multiprocessor of an H200)

#: Longest row one program sorts whole: where few rows leave the GPU to the segmented select,
#: and where the rows alone fill it (the row select wins beyond, ``benchmarks/topk_select.py``).
ROW_SORT_MAX = 2048
ROW_SORT_MAX_MANY_ROWS = 1024
#: Longest row one program selects from in registers (``_row_select_kernel``): a 16k-token
#: chunk's entries at ratio 4; rows of 8,192 spill registers (sm_90a, on 8 and on 16 warps).
ROW_SELECT_MAX = 4096

# which entries a row may see
ALL, PREFIX, MASK = 0, 1, 2


@triton.jit
def _visible(n_vis, allowed_ptr, idx, inb, MODE: tl.constexpr):
    if MODE == 1:  # the row's first n_vis entries
        return inb & (idx < n_vis)
    elif MODE == 2:  # a mask row
        return inb & (tl.load(allowed_ptr + idx, mask=inb, other=0) != 0)
    else:
        return inb


@triton.jit
def _ordered(score_ptr, idx, inb, visible):
    """int32 keys ordered as the fp32 scores (-inf where not visible; -0.0 ties +0.0)."""
    s = tl.load(score_ptr + idx, mask=inb, other=0.0).to(tl.float32)
    s = tl.where(visible, s, float("-inf"))
    s = tl.where(s == 0.0, 0.0, s)
    bits = s.to(tl.int32, bitcast=True)
    return bits ^ ((bits >> 31) & 0x7FFFFFFF)


@triton.jit
def _row_keys(  # noqa: PLR0917 (a jit helper takes positional arguments)
    score_ptr, n_vis_ptr, allowed_ptr, entries, score_stride,
    MODE: tl.constexpr, T_PAD: tl.constexpr,
):  # fmt: skip
    """A one-program row's (index, its ``allowed`` row, its visible count, entry ids [T_PAD],
    which are in bounds, their ordered keys)."""
    row = tl.program_id(0).to(tl.int64)
    allowed_ptr += row * entries
    n_vis = 0
    if MODE == 1:
        n_vis = tl.load(n_vis_ptr + row)
    idx = tl.arange(0, T_PAD)
    inb = idx < entries
    o = _ordered(
        score_ptr + row * score_stride, idx, inb, _visible(n_vis, allowed_ptr, idx, inb, MODE)
    )
    return row, allowed_ptr, n_vis, idx, inb, o


@triton.jit
def _unsigned(o):
    """The ordered int32 keys as unsigned numbers of the same order (for radix digits)."""
    return (o ^ -2147483648).to(tl.uint32, bitcast=True)


@triton.jit
def _threshold(hist_ptr, k, PASSES: tl.constexpr):
    """(prefix, rem) after ``PASSES`` radix passes: the top 8*PASSES bits of the k-th largest
    key, and how many picks are still to place among the entries that share them."""
    bins = tl.arange(0, 256)
    prefix = tl.zeros([], dtype=tl.uint32)
    rem = k
    for p in tl.static_range(PASSES):
        hist = tl.load(hist_ptr + p * 256 + bins)
        at_least = tl.sum(hist, 0) - tl.cumsum(hist, 0) + hist  # entries with digit >= d
        d = tl.max(tl.where(at_least >= rem, bins, 0), 0)
        rem -= tl.sum(tl.where(bins > d, hist, 0), 0)
        prefix = (prefix << 8) | d.to(tl.uint32)
    return prefix, rem


@triton.jit(do_not_specialize=["entries", "k", "segment"])
def _histogram_kernel(  # noqa: PLR0917 (Triton kernels take positional arguments)
    score_ptr,  # [R, entries] fp32, row stride score_stride
    n_vis_ptr,  # [R] int (PREFIX)
    allowed_ptr,  # [R, entries] bool (MASK)
    hist_ptr,  # [R, 4, 256] int32, zeroed
    entries,
    k,
    segment,  # entries per program, a multiple of BLOCK
    score_stride,
    PASS: tl.constexpr,
    MODE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Pass ``PASS`` of the radix select: one segment's histogram of the digit below the
    prefix found by the earlier passes, added to its row's."""
    row = tl.program_id(0).to(tl.int64)
    first = tl.program_id(1) * segment
    score_ptr += row * score_stride
    allowed_ptr += row * entries
    hist_ptr += row * 1024
    n_vis = 0
    if MODE == 1:
        n_vis = tl.load(n_vis_ptr + row)
    prefix, _ = _threshold(hist_ptr, k, PASS)
    shift = 24 - 8 * PASS
    offs = tl.arange(0, BLOCK)
    hist = tl.zeros([256], dtype=tl.int32)
    for start in range(first, tl.minimum(first + segment, entries), BLOCK):
        idx = start + offs
        inb = idx < entries
        vis = _visible(n_vis, allowed_ptr, idx, inb, MODE)
        u = _unsigned(_ordered(score_ptr, idx, inb, vis))
        match = inb
        if PASS > 0:
            match = inb & ((u >> (shift + 8)) == prefix)
        hist += tl.histogram(((u >> shift) & 255).to(tl.int32), 256, mask=match)
    tl.atomic_add(hist_ptr + PASS * 256 + tl.arange(0, 256), hist)


@triton.jit(do_not_specialize=["entries", "k", "segment"])
def _collect_kernel(  # noqa: PLR0917 (Triton kernels take positional arguments)
    score_ptr,
    n_vis_ptr,
    allowed_ptr,
    hist_ptr,  # [R, 4, 256] int32, all passes done
    count_ptr,  # [R, SEGMENTS_PAD, 2] int32: entries above / equal to the threshold
    scratch_ptr,  # [R, K_PAD] int64
    entries,
    k,
    segment,
    score_stride,
    WRITE: tl.constexpr,  # False: count the segment's entries; True: write its picks
    MODE: tl.constexpr,
    K_PAD: tl.constexpr,
    SEGMENTS_PAD: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Picks are the entries above the threshold and the first ``rem`` equal to it, in entry
    order: a first launch counts both per segment, a second places each segment's picks
    after those of the segments before it, as the reference's int64 keys."""
    row = tl.program_id(0).to(tl.int64)
    seg = tl.program_id(1)
    first = seg * segment
    score_ptr += row * score_stride
    allowed_ptr += row * entries
    count_ptr += row * SEGMENTS_PAD * 2
    n_vis = 0
    if MODE == 1:
        n_vis = tl.load(n_vis_ptr + row)
    thr, rem = _threshold(hist_ptr + row * 1024, k, 4)
    taken = 0
    ties = 0
    if WRITE:
        others = tl.arange(0, SEGMENTS_PAD)
        before = others < seg
        above = tl.sum(tl.load(count_ptr + others * 2, mask=before, other=0), 0)
        ties = tl.sum(tl.load(count_ptr + others * 2 + 1, mask=before, other=0), 0)
        taken = above + tl.minimum(ties, rem)
    offs = tl.arange(0, BLOCK)
    n_above = 0
    n_equal = 0
    for start in range(first, tl.minimum(first + segment, entries), BLOCK):
        idx = start + offs
        inb = idx < entries
        vis = _visible(n_vis, allowed_ptr, idx, inb, MODE)
        o = _ordered(score_ptr, idx, inb, vis)
        u = _unsigned(o)
        gt = inb & (u > thr)
        eq = (inb & (u == thr)).to(tl.int32)
        if WRITE:
            tie_rank = ties + tl.cumsum(eq, 0) - eq
            take = gt | ((eq != 0) & (tie_rank < rem))
            take_i = take.to(tl.int32)
            pos = taken + tl.cumsum(take_i, 0) - take_i
            key = (o.to(tl.int64) << 32) | (entries - 1 - idx).to(tl.int64)
            tl.store(scratch_ptr + row * K_PAD + pos, key, mask=take)
            taken += tl.sum(take_i, 0)
            ties += tl.sum(eq, 0)
        else:
            n_above += tl.sum(gt.to(tl.int32), 0)
            n_equal += tl.sum(eq, 0)
    if not WRITE:
        tl.store(count_ptr + seg * 2, n_above)
        tl.store(count_ptr + seg * 2 + 1, n_equal)


@triton.jit(do_not_specialize=["entries", "k"])
def _row_select_kernel(  # noqa: PLR0917 (Triton kernels take positional arguments)
    score_ptr,
    n_vis_ptr,
    allowed_ptr,
    scratch_ptr,  # [R, K_PAD] int64: the row's k picks as keys, in entry order
    entries,
    k,
    score_stride,
    MODE: tl.constexpr,
    T_PAD: tl.constexpr,
    K_PAD: tl.constexpr,
):
    """The histogram passes and the collection of one row of at most ``T_PAD`` entries, its
    keys held in registers: the same threshold and picks as the segmented kernels."""
    row, _, _, idx, inb, o = _row_keys(
        score_ptr, n_vis_ptr, allowed_ptr, entries, score_stride, MODE, T_PAD
    )
    u = _unsigned(o)
    bins = tl.arange(0, 256)
    prefix = tl.zeros([], dtype=tl.uint32)
    rem = k
    for p in tl.static_range(4):  # the digits of the k-th largest key, as _threshold finds them
        shift = 24 - 8 * p
        match = inb
        if p > 0:
            match = inb & ((u >> (shift + 8)) == prefix)
        hist = tl.histogram(((u >> shift) & 255).to(tl.int32), 256, mask=match)
        at_least = tl.sum(hist, 0) - tl.cumsum(hist, 0) + hist
        d = tl.max(tl.where(at_least >= rem, bins, 0), 0)
        rem -= tl.sum(tl.where(bins > d, hist, 0), 0)
        prefix = (prefix << 8) | d.to(tl.uint32)
    eq = (inb & (u == prefix)).to(tl.int32)
    take = (inb & (u > prefix)) | ((eq != 0) & (tl.cumsum(eq, 0) - eq < rem))
    take_i = take.to(tl.int32)
    key = (o.to(tl.int64) << 32) | (entries - 1 - idx).to(tl.int64)
    tl.store(scratch_ptr + row * K_PAD + tl.cumsum(take_i, 0) - take_i, key, mask=take)


@triton.jit(do_not_specialize=["entries", "k"])
def _sort_kernel(  # noqa: PLR0917 (Triton kernels take positional arguments)
    n_vis_ptr,
    allowed_ptr,
    scratch_ptr,  # [R, K_PAD] int64: a row's k picks as keys
    out_ptr,  # [R, k] int64
    entries,
    k,
    MODE: tl.constexpr,
    K_PAD: tl.constexpr,
):
    """A row's k keys in descending order (unique keys: the reference's order), as entry ids,
    -1 for entries the row may not see."""
    row = tl.program_id(0).to(tl.int64)
    allowed_ptr += row * entries
    n_vis = 0
    if MODE == 1:
        n_vis = tl.load(n_vis_ptr + row)
    j = tl.arange(0, K_PAD)
    keys = tl.load(scratch_ptr + row * K_PAD + j, mask=j < k, other=-9223372036854775808)
    keys = tl.sort(keys, descending=True)
    ids = (entries - 1) - (keys & 0xFFFFFFFF)
    ok = _visible(n_vis, allowed_ptr, ids, j < k, MODE)
    tl.store(out_ptr + row * k + j, tl.where(ok, ids, -1), mask=j < k)


@triton.jit(do_not_specialize=["entries", "k"])
def _row_sort_kernel(  # noqa: PLR0917 (Triton kernels take positional arguments)
    score_ptr,
    n_vis_ptr,
    allowed_ptr,
    out_ptr,  # [R, k] int64
    entries,
    k,
    score_stride,
    MODE: tl.constexpr,
    T_PAD: tl.constexpr,
):
    """A row of at most ``T_PAD`` entries: all its keys (the collect kernel's) sorted in
    descending order, the first k written as entry ids, -1 for entries it may not see."""
    row, allowed_ptr, n_vis, idx, inb, o = _row_keys(
        score_ptr, n_vis_ptr, allowed_ptr, entries, score_stride, MODE, T_PAD
    )
    keys = (o.to(tl.int64) << 32) | (entries - 1 - idx).to(tl.int64)
    keys = tl.sort(tl.where(inb, keys, -9223372036854775808), descending=True)
    ids = (entries - 1) - (keys & 0xFFFFFFFF)
    first = idx < k  # real entries all: k <= entries, and padding sorts last
    ok = _visible(n_vis, allowed_ptr, ids, first, MODE)
    tl.store(out_ptr + row * k + idx, tl.where(ok, ids, -1), mask=first)


def fits(k: int) -> bool:
    """Whether a row's k picks fit the kernel's register sort."""
    return k <= MAX_K


def stable_topk_picks(
    scores: Tensor, k: int, *, n_visible: Tensor | None = None, allowed: Tensor | None = None
) -> Tensor:
    """Top-``k`` entries of each row of ``scores`` [..., T] (fp32), highest first, ties to the
    lower entry id; entries a row may not see (past ``n_visible`` [...] or where ``allowed``
    [..., T] is False) count as -inf and are returned as -1. Returns [..., k] int64."""
    lead, t = scores.shape[:-1], scores.shape[-1]
    assert 0 < k <= t and fits(k), (k, t)
    flat = scores.reshape(-1, t)
    if flat.stride(-1) != 1:
        flat = flat.contiguous()
    rows = flat.shape[0]
    mode, n_vis, mask = ALL, flat, flat
    if n_visible is not None:
        mode = PREFIX
        n_vis = n_visible.to(scores.device).expand(lead).reshape(rows).contiguous()
    elif allowed is not None:
        mode = MASK
        mask = allowed.expand(scores.shape).reshape(rows, t).contiguous()
    dev = scores.device
    out = torch.empty(rows, k, dtype=torch.int64, device=dev)
    if t <= (ROW_SORT_MAX_MANY_ROWS if rows >= TARGET_PROGRAMS else ROW_SORT_MAX):
        if rows:
            t_pad = max(16, triton.next_power_of_2(t))
            _row_sort_kernel[(rows,)](
                flat, n_vis, mask, out, t, k, flat.stride(0), MODE=mode, T_PAD=t_pad,
                num_warps=8 if t_pad >= 1024 else 4,
            )  # fmt: skip
        return out.view(*lead, k)
    k_pad = triton.next_power_of_2(k)
    block = min(BLOCK, triton.next_power_of_2(t))
    # split rows into segments until about TARGET_PROGRAMS programs run each pass
    chunks = triton.cdiv(t, block)
    per_row = max(1, min(chunks, TARGET_PROGRAMS // max(rows, 1)))
    segment = triton.cdiv(chunks, per_row) * block
    segments = triton.cdiv(t, segment)
    segments_pad = triton.next_power_of_2(segments)
    scratch = torch.empty(rows, k_pad, dtype=torch.int64, device=dev)
    t_pad = triton.next_power_of_2(t)
    if rows and segments == 1 and t_pad <= ROW_SELECT_MAX:
        _row_select_kernel[(rows,)](
            flat, n_vis, mask, scratch, t, k, flat.stride(0), MODE=mode, T_PAD=t_pad,
            K_PAD=k_pad, num_warps=NUM_WARPS,
        )  # fmt: skip
        _sort_kernel[(rows,)](n_vis, mask, scratch, out, t, k, MODE=mode, K_PAD=k_pad)
        return out.view(*lead, k)
    hist = torch.zeros(rows, 4, 256, dtype=torch.int32, device=dev)
    counts = torch.empty(rows, segments_pad, 2, dtype=torch.int32, device=dev)
    if rows:
        grid = (rows, segments)
        common = dict(MODE=mode, BLOCK=block, num_warps=NUM_WARPS)
        for p in range(4):
            _histogram_kernel[grid](
                flat, n_vis, mask, hist, t, k, segment, flat.stride(0), PASS=p, **common
            )
        for write in (False, True):
            _collect_kernel[grid](
                flat,
                n_vis,
                mask,
                hist,
                counts,
                scratch,
                t,
                k,
                segment,
                flat.stride(0),
                WRITE=write,
                K_PAD=k_pad,
                SEGMENTS_PAD=segments_pad,
                **common,
            )
        _sort_kernel[(rows,)](n_vis, mask, scratch, out, t, k, MODE=mode, K_PAD=k_pad)
    return out.view(*lead, k)
