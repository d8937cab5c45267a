"""The target's step time against the tokens of the step, for confidence-scheduled verification.

The verify planner (:mod:`.verify_plan`) weighs the tokens a step is expected to emit against
the time the step takes, ``SPS(B)`` steps per second at ``B`` tokens (``dspark.md`` §6.2, §6.5).
That curve is machine- and model-specific and not smooth (padding buckets, tile sizes, a flat
stretch while the step is bound by its fixed overhead), so it is measured rather than modelled:
dummy steps of the model's own ragged pass at a ladder of token counts, each the median of a
few runs, forced non-decreasing in ``B`` with a running max (a larger step never reported as
cheaper, as vLLM does: noise must not invite longer rows). Lookup interpolates linearly between
measured points and extrapolates the last segment's slope past the end; below the first point
it is the first point's time. A table can also be given (``{tokens: seconds}``) and read back
with :meth:`VerifyCost.as_dict`, so one profile serves many engines.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

from deepinfer.cache.slots import StateSlots
from deepinfer.models.batch import ForwardBatch
from deepinfer.models.causal_lm import DeepseekCausalLM
from deepinfer.models.state import ModelState

#: Runs per profiled point (the median is kept).
PROFILE_REPEATS = 3
#: Most tokens a profiled step holds; past it the last slope is extrapolated. On a CPU, whose
#: steps are slow and close to linear in tokens well before this, start-up stays short.
PROFILE_MAX_TOKENS = 1024
PROFILE_MAX_TOKENS_CPU = 128


@dataclass(frozen=True)
class VerifyCost:
    """Seconds of one target step against its tokens: strictly increasing ``tokens``,
    non-decreasing ``seconds`` (build one with :meth:`from_table`)."""

    tokens: tuple[int, ...]
    seconds: tuple[float, ...]

    @classmethod
    def from_table(cls, table: Mapping[int, float]) -> VerifyCost:
        """The cost of ``{tokens: seconds}`` (at least one point; tokens >= 1, seconds > 0),
        made non-decreasing by a running max over increasing tokens."""
        if not table:
            raise ValueError("a verify cost table needs at least one point")
        points = sorted(table.items())
        for n, s in points:
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ValueError(f"verify cost tokens must be integers >= 1, got {n!r}")
            if isinstance(s, bool) or not isinstance(s, int | float) or not 0 < s < math.inf:
                raise ValueError(f"verify cost seconds must be positive and finite, got {s!r}")
        seconds, top = [], 0.0
        for _, s in points:
            top = max(top, float(s))
            seconds.append(top)
        return cls(tuple(n for n, _ in points), tuple(seconds))

    def step_seconds(self, num_tokens: int) -> float:
        """Seconds of a step of ``num_tokens`` tokens (see the module for the lookup)."""
        xs, ys = self.tokens, self.seconds
        if num_tokens <= xs[0]:
            return ys[0]
        if num_tokens >= xs[-1]:
            if len(xs) == 1:
                return ys[0]
            slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
            return ys[-1] + slope * (num_tokens - xs[-1])
        hi = next(i for i, x in enumerate(xs) if x >= num_tokens)
        x0, x1, y0, y1 = xs[hi - 1], xs[hi], ys[hi - 1], ys[hi]
        # capped at y1: rounding must not lift a point above the next, flat, segment
        return min(y1, y0 + (y1 - y0) * (num_tokens - x0) / (x1 - x0))

    def steps_per_second(self, num_tokens: int) -> float:
        """``SPS(B)``: the planner's throughput factor."""
        return 1.0 / self.step_seconds(num_tokens)

    def as_dict(self) -> dict[int, float]:
        """The table, as :meth:`from_table` takes it back."""
        return dict(zip(self.tokens, self.seconds, strict=True))


def profile_points(limit: int) -> list[int]:
    """Token counts to profile up to ``limit``: the powers of two and the midpoints between
    them (1, 2, 3, 4, 6, 8, 12, ...), and ``limit`` itself."""
    points, p = {limit}, 1
    while p < limit:
        points.update(x for x in (p, p + p // 2) if x < limit)
        p *= 2
    return sorted(points)


def row_lengths(num_tokens: int, row: int) -> list[int]:
    """A step of ``num_tokens`` as verification rows of ``row`` tokens (the last shorter)."""
    full, rest = divmod(num_tokens, row)
    return [row] * full + ([rest] if rest else [])


@torch.no_grad()
def profile_verify_cost(
    model: DeepseekCausalLM,
    num_speculative_tokens: int,
    max_num_seqs: int,
    repeats: int = PROFILE_REPEATS,
) -> VerifyCost:
    """Time dummy verification steps of ``model`` at each of :func:`profile_points` up to
    ``max_num_seqs * (k + 1)`` tokens (capped, see the constants): rows of ``k + 1`` tokens on
    slot states in one pass that keeps every logit, as a speculative step runs them. Each state
    is rolled back after a run, so every run starts from the same empty context (the table
    prices a step's tokens, not attention over a long context); the runs of a point are taken
    in separate passes over all points, and the median of each kept."""
    row = num_speculative_tokens + 1
    cap = PROFILE_MAX_TOKENS_CPU if model.device.type == "cpu" else PROFILE_MAX_TOKENS
    points = profile_points(max(1, min(max_num_seqs * row, cap)))
    rows = len(row_lengths(points[-1], row))
    slots = StateSlots(
        lambda: model.new_state(1, slack=row),
        max_slots=rows,
        max_len=row + 1,
        initial_slots=rows,
        initial_pages=rows,
    )
    states = [slots.new_state() for _ in range(rows)]
    cfg = model.cfg
    top = cfg.vocab_size if cfg.image_token_id is None else min(cfg.vocab_size, cfg.image_token_id)
    ids = torch.randint(3, top, (points[-1],), generator=torch.Generator().manual_seed(0))
    runs: dict[int, list[float]] = {n: [] for n in points}
    try:
        _run(model, states, ids, row_lengths(points[-1], row))  # warm-up: allocations, caches
        for _ in range(repeats):  # whole passes: a burst of load spoils one run per point
            for n in points:
                runs[n].append(_run(model, states, ids, row_lengths(n, row)))
    finally:
        for state in states:
            slots.release(state)
    return VerifyCost.from_table({n: statistics.median(r) for n, r in runs.items()})


def _run(
    model: DeepseekCausalLM, states: list[ModelState], ids: Tensor, lengths: list[int]
) -> float:
    """Seconds of one step feeding ``states[i]`` ``lengths[i]`` of ``ids``, rolled back after."""
    chunks, start = [], 0
    for n in lengths:
        chunks.append(ids[start : start + n])
        start += n
    used = states[: len(lengths)]
    batch = ForwardBatch.build(chunks, used, list(lengths), return_streams=True)
    begin = time.perf_counter()
    out = model(batch)
    out.logits.reshape(-1)[-1:].cpu()  # waits for the device
    seconds = time.perf_counter() - begin
    for state in used:
        model.rollback(state, 0)
    return seconds
