"""The index arithmetic of a ragged pass: which rows every layer gathers and scatters.

A ragged pass feeds spans of any length whose states live in shared slot tensors (see
:mod:`.ragged`). Each layer reads and writes all spans with a fixed number of indexed ops; the
indices depend only on where the spans stand, so each is built once per step (on the host,
where it is a few ops per span) and shared by every layer through the step memo:

* :func:`window_plan`: each query's ``window`` keys among [the spans' ring rows as they stood
  before the step ; the step's new rows], and which new rows the rings keep;
* :func:`close_plan`: for one compression ratio, the windows the step completes (each as
  ``ratio`` rows of [the spans' open windows ; the step's new projections]), the window before
  each (for overlapping compressors), and which new rows stay open;
* :func:`score_groups`: spans of similar length grouped for the ops that score a span's
  queries against its own keys, so a step of many spans costs a few ops, not a few per span.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from deepinfer.models.layouts import RaggedMeta
from deepinfer.transfer import to_device


def _upload(device: torch.device, *parts: Tensor) -> list[Tensor]:
    """1-D long host tensors on ``device`` through one copy (each is a view of it)."""
    packed = to_device(torch.cat(parts), device)
    return list(packed.split([len(p) for p in parts]))


@dataclass(frozen=True)
class _SpanColumns:
    """The spans' slots, starts, lengths and packed offsets as host tensors [n]."""

    slot: Tensor
    start: Tensor
    length: Tensor
    offset: Tensor


def _columns(meta: RaggedMeta) -> _SpanColumns:
    def make() -> _SpanColumns:
        cols = [meta.slot_ids, meta.starts, meta.lengths, meta.offsets]
        table = torch.tensor(cols, dtype=torch.long).reshape(4, meta.num_spans)
        return _SpanColumns(*table.unbind(0))

    return meta.step_memo.get("span columns", make)


def _runs(counts: Tensor) -> tuple[Tensor, Tensor]:
    """For runs of ``counts[i]`` items per span, in span order: each item's span and its
    index within its run (``sum(counts)`` of each)."""
    span = torch.repeat_interleave(torch.arange(len(counts)), counts)
    begin = torch.cumsum(counts, 0) - counts
    return span, torch.arange(len(span)) - begin[span]


@dataclass
class WindowPlan:
    """A ring shape's gathers and scatters for one ragged step."""

    index: Tensor  # [1, N, window]: rows of [n * capacity ring rows ; N new rows], -1 = none
    write_tokens: Tensor  # [M] new rows the rings keep (each span's last ``capacity``)
    write_slots: Tensor  # [M] their slot
    write_rows: Tensor  # [M] their ring row (position % capacity)


def window_plan(meta: RaggedMeta, capacity: int, window: int) -> WindowPlan:
    """:class:`WindowPlan` for rings of ``capacity`` rows and an attention ``window``.

    Query t at position p sees positions p - j, j < window. One inside its span's chunk is new
    row ``t - j``; one before it is ring row ``p - j`` of its span's slot, still there because
    ``capacity >= window`` and the ring held every position up to the span's start.
    """
    device = meta.positions.device
    p = meta.positions[:, None]
    j = torch.arange(window, device=device)
    q = p - j
    t = torch.arange(p.shape[0], device=device)[:, None]
    ring_row = meta.token_span[:, None] * capacity + q.remainder(capacity)
    index = torch.where(q >= meta.span_start[:, None], meta.num_spans * capacity + t - j, ring_row)
    index = torch.where(q < 0, -1, index)
    writes = ring_writes(meta, capacity)
    return WindowPlan(index[None], writes.tokens, writes.slots, writes.rows)


@dataclass
class RingWrites:
    """The new rows a ring of ``capacity`` rows per slot keeps after a ragged step: each
    span's last ``capacity`` tokens, at row position % capacity of its slot."""

    tokens: Tensor  # [M]
    slots: Tensor  # [M]
    rows: Tensor  # [M]


def ring_writes(meta: RaggedMeta, capacity: int) -> RingWrites:
    """:class:`RingWrites` for rings of ``capacity`` rows (memoised in the step)."""

    def make() -> RingWrites:
        c = _columns(meta)
        span, j = _runs(torch.clamp(c.length, max=capacity))
        kept = torch.clamp(c.length - capacity, min=0)[span] + j  # token within its span
        return RingWrites(
            *_upload(
                meta.positions.device,
                c.offset[span] + kept,
                c.slot[span],
                (c.start[span] + kept) % capacity,
            )
        )

    return meta.step_memo.get(("ring writes", capacity), make)


def look_back_index(meta: RaggedMeta, history: int) -> tuple[Tensor, Tensor]:
    """Where each token's look-back window and each span's look-back after the step lie in
    [the n spans' look-backs before the step (``history`` ids each) ; the N packed tokens]:
    ([N, history + 1], the token last; [n, history]), built for all spans at once."""
    n, h, c = meta.num_spans, history, _columns(meta)
    span, j = _runs(c.length)
    p = j[:, None] - h + torch.arange(h + 1)  # [N, h + 1] positions within the span
    window = torch.where(p < 0, span[:, None] * h + h + p, n * h + c.offset[span][:, None] + p)
    q = c.length[:, None] + torch.arange(h)  # [n, h]: the last h of [look-back ; chunk]
    spans = torch.arange(n)[:, None]
    after = torch.where(q < h, spans * h + q, n * h + c.offset[:, None] + q - h)
    window_d, after_d = _upload(meta.positions.device, window.flatten(), after.flatten())
    return window_d.view(-1, h + 1), after_d.view(n, h)


@dataclass
class ClosePlan:
    """One compression ratio's gathers and scatters for one ragged step."""

    rows: Tensor  # [W, ratio]: rows of [n * ratio open-window rows ; N new rows]
    entry: Tensor  # [W] the entry each completed window makes
    entry_slots: Tensor  # [W] its span's slot
    #: [W]: the window before each, as a row of [the W windows ; the n spans' stored halves]
    prev: Tensor
    last: Tensor  # [m] the last window each span completes (spans completing any)
    last_slots: Tensor  # [m]
    open_tokens: Tensor  # [M] new rows left in an open window
    open_slots: Tensor  # [M]
    open_rows: Tensor  # [M] their row in the window (position % ratio)
    counts: list[int]  # entries each span holds after the step

    @property
    def num_windows(self) -> int:
        return self.rows.shape[0]


def close_plan(meta: RaggedMeta, ratio: int) -> ClosePlan:
    """:class:`ClosePlan` for compressors of ``ratio``: window e covers positions
    ``e*ratio ..``; a row before the span's start is still in its open window (row
    ``position % ratio``), the rest are new. Built for all spans at once (a few host ops
    per step, not per span)."""
    n, r, c = meta.num_spans, ratio, _columns(meta)
    end = c.start + c.length
    first, stop = c.start // r, end // r
    # Windows the step completes: e in [first, stop) of each span, W in all.
    span, j = _runs(stop - first)
    done = len(span)
    entry = first[span] + j
    q = entry[:, None] * r + torch.arange(r)  # [W, r] positions
    start = c.start[span][:, None]
    rows = torch.where(
        q >= start, n * r + c.offset[span][:, None] + q - start, span[:, None] * r + q % r
    )
    # The window before each: the previous one, or for a span's first its stored half (row
    # W + span of [the W windows ; the n spans' stored halves]).
    w = torch.arange(done)
    prev = torch.where(j == 0, done + span, w - 1)
    ends = torch.cumsum(stop - first, 0)
    completes = stop > first
    # New rows left in an open window: positions [max(start, stop * r), end).
    low = torch.maximum(c.start, stop * r)
    tail_span, k = _runs(end - low)
    tail = low[tail_span] + k
    out = _upload(
        meta.positions.device,
        rows.flatten(),
        entry,
        c.slot[span],
        prev,
        (ends - 1)[completes],
        c.slot[completes],
        c.offset[tail_span] + tail - c.start[tail_span],
        c.slot[tail_span],
        tail % r,
    )
    return ClosePlan(out[0].view(done, r), *out[1:], counts=stop.tolist())


@dataclass
class ScoreGroup:
    """Spans whose queries are scored as one [G, S] batch, each row one span's tokens
    padded at the end with its last."""

    spans: Tensor  # [G] span indices
    members: list[int]  # the same on the host
    tokens: Tensor  # [G, S] token of each row and column (padding repeats the last)
    real: Tensor  # [G, S] bool: a real token, not padding
    flat_real: Tensor  # [R] positions of the real tokens in the flattened [G * S]
    flat_tokens: Tensor  # [R] their tokens


def score_groups(meta: RaggedMeta) -> list[ScoreGroup]:
    """The step's spans in groups of similar length (each group pads within
    ``meta.padding`` times its real tokens; 0: equal lengths)."""
    order = sorted(range(meta.num_spans), key=lambda i: meta.lengths[i])
    groups: list[list[int]] = []
    real = 0
    for i in order:  # ascending: the newest member is the group's longest
        n = meta.lengths[i]
        if groups and (len(groups[-1]) + 1) * n <= (1 + meta.padding) * (real + n):
            groups[-1].append(i)
            real += n
        else:
            groups.append([i])
            real = n
    return [_score_group(meta, g) for g in groups]


def _score_group(meta: RaggedMeta, group: list[int]) -> ScoreGroup:
    width = max(meta.lengths[i] for i in group)
    cols = torch.arange(width)
    lengths = torch.tensor([meta.lengths[i] for i in group])[:, None]
    offsets = torch.tensor([meta.offsets[i] for i in group])[:, None]
    tokens = offsets + torch.minimum(cols, lengths - 1)
    real = cols < lengths
    flat_real = real.flatten().nonzero()[:, 0]
    device = meta.positions.device
    return ScoreGroup(
        spans=to_device(torch.tensor(group), device),
        members=group,
        tokens=to_device(tokens, device),
        real=to_device(real, device),
        flat_real=to_device(flat_real, device),
        flat_tokens=to_device(tokens.flatten()[flat_real], device),
    )


def group_entries(meta: RaggedMeta, group: ScoreGroup, ratio: int) -> int:
    """Entries of ``ratio`` the group's longest-held span has after the step: the keys its
    queries are scored against (a group of short spans reads no further than its own)."""
    return max((meta.starts[i] + meta.lengths[i]) // ratio for i in group.members)


def by_score_group(
    meta: RaggedMeta, width: int, score: Callable[[int, ScoreGroup], Tensor]
) -> Tensor:
    """[1, N, width] long: ``score(b, group)`` ([G, S, <= width] for group b's rows, -1 =
    none) put back in token order, -1 past each group's own width."""
    groups = meta.step_memo.get("score groups", lambda: score_groups(meta))
    out = torch.full(
        (meta.positions.shape[0], width), -1, dtype=torch.long, device=meta.positions.device
    )
    for b, group in enumerate(groups):
        picks = score(b, group)
        out[group.flat_tokens, : picks.shape[-1]] = picks.flatten(0, 1)[group.flat_real]
    return out[None]
