"""The target's step time, for confidence-scheduled verification: a plain step against its rows,
a step with verification rows against its rows and tokens.

The verify planner (:mod:`.verify_plan`) weighs the tokens a step is expected to emit against
the time the step takes (``dspark.md`` §6.2, §6.5), and its alternative to verifying drafts is
a plain decode step, so it needs both times, and they are two different passes. A plain step of
``R`` single-token rows is the decode pass (a fixed sequence of ops over the slot rows, one
logit and one draw per row). A step with verification rows is the verification pass (rows
padded to a fixed width, every row's window gathered and its candidate compressor windows
pooled), keeping every logit of every row, with the drafter's features captured, a draw at
every position and the rows that rejected drafts rolled back. A single table by token count
would price the plain step as a verification pass of a few long rows, and a step of many rows
with a draft or two each as if its tokens came in long rows: it would hide the extra cost of
verifying exactly where that cost is largest.

So :class:`StepCost` keeps the two apart: ``plain`` by rows, and for each of a ladder of row
counts the verification step by tokens; a step of ``R`` rows and ``T > R`` tokens is looked up
at ``T / R`` tokens per row on the row counts measured around ``R``, interpolated linearly in
``R``. Both are measured, not modelled (padding buckets, tile sizes and a flat stretch while a
step is bound by its fixed overhead make the curves uneven): :mod:`.verify_profile` times dummy
steps of the model's own passes. Each curve is forced non-decreasing with a running max (a
larger step never reported as cheaper, as vLLM does: noise must not invite longer rows), and a
verification step is never cheaper than the plain step of its rows. Lookup in one curve
(:class:`VerifyCost`) interpolates linearly between measured points and extrapolates the last
segment's slope past the end; below the first point it is the first point's time.

The draws are priced apart too: a greedy draw is an argmax, a draw at a temperature above 0
(softmax, filters, noise for every token of the vocabulary) can cost as much as the pass
itself on a CPU, so both passes are timed with greedy draws and ``draws`` adds what drawing
``n`` positions with noise costs on top; the planner counts the positions of sampled requests.

A table can also be given: ``{tokens: seconds}`` prices every step by its tokens alone (the
plain step of ``R`` rows at ``R`` tokens, unless a plain table ``{rows: seconds}`` is given
too), so a schedule can be pinned down without profiling.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class VerifyCost:
    """Seconds of one step against a count (tokens, rows or requests): strictly increasing
    ``tokens``, non-decreasing ``seconds`` (build one with :meth:`from_table`)."""

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

    def step_seconds(self, num_tokens: float) -> float:
        """Seconds of a step of ``num_tokens`` tokens (see the module for the lookup)."""
        xs, ys = self.tokens, self.seconds
        if num_tokens <= xs[0]:
            return ys[0]
        if num_tokens >= xs[-1]:
            if len(xs) == 1:
                return ys[0]
            slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
            return ys[-1] + slope * (num_tokens - xs[-1])
        hi = bisect.bisect_left(xs, num_tokens)
        x0, x1, y0, y1 = xs[hi - 1], xs[hi], ys[hi - 1], ys[hi]
        # capped at y1: rounding must not lift a point above the next, flat, segment
        return min(y1, y0 + (y1 - y0) * (num_tokens - x0) / (x1 - x0))

    def steps_per_second(self, num_tokens: float) -> float:
        """``SPS(B)``: the planner's throughput factor."""
        return 1.0 / self.step_seconds(num_tokens)

    def as_dict(self) -> dict[int, float]:
        """The table, as :meth:`from_table` takes it back."""
        return dict(zip(self.tokens, self.seconds, strict=True))


@dataclass(frozen=True)
class StepCost:
    """Seconds of a target step against its rows and tokens (see the module).

    ``plain``: a step whose every row is one token, by rows. ``verify[i]``: a step of
    ``rows[i]`` rows with more tokens than rows, by tokens. With ``rows`` empty, ``verify``
    holds one curve that prices such a step by its tokens alone, whatever its rows. Both
    with greedy draws; ``draws``: what drawing that many positions with noise (a sampled
    request's) adds, by positions (None: nothing)."""

    plain: VerifyCost
    verify: tuple[VerifyCost, ...]
    rows: tuple[int, ...] = ()
    draws: VerifyCost | None = None

    def __post_init__(self) -> None:
        if len(self.verify) != max(1, len(self.rows)):
            raise ValueError("a step cost needs one verification curve per row count")
        if list(self.rows) != sorted(set(self.rows)):
            raise ValueError("a step cost's row counts must be strictly increasing")

    @classmethod
    def by_tokens(cls, table: VerifyCost, plain: VerifyCost | None = None) -> StepCost:
        """Every step priced by its tokens on ``table``; a plain step on ``plain`` by its rows
        when given (else on ``table``, at as many tokens as rows)."""
        return cls(plain or table, (table,))

    def seconds(self, rows: int, tokens: int, noisy: int = 0) -> float:
        """Seconds of a step of ``rows`` rows and ``tokens`` tokens in all (a plain step when
        they are equal), ``noisy`` of its positions drawn with noise."""
        drawn = self.draws.step_seconds(noisy) if self.draws is not None and noisy > 0 else 0.0
        return self._pass_seconds(rows, tokens) + drawn

    def _pass_seconds(self, rows: int, tokens: int) -> float:
        """Seconds of the step with greedy draws (see the module for the lookup)."""
        if tokens <= rows:
            return self.plain.step_seconds(rows)
        if not self.rows:
            return self.verify[0].step_seconds(tokens)
        per_row = tokens / rows
        levels = self.rows
        if len(levels) == 1 or rows <= levels[0]:
            return self.verify[0].step_seconds(levels[0] * per_row)
        hi = bisect.bisect_left(levels, rows)
        if hi < len(levels) and levels[hi] == rows:
            return self.verify[hi].step_seconds(tokens)
        hi = min(hi, len(levels) - 1)
        lo = hi - 1
        y0 = self.verify[lo].step_seconds(levels[lo] * per_row)
        y1 = self.verify[hi].step_seconds(levels[hi] * per_row)
        value = y0 + (y1 - y0) * (rows - levels[lo]) / (levels[hi] - levels[lo])
        # past the last row count: extrapolated, but never below the last measured step
        return max(value, y1) if rows > levels[-1] else value

    def plain_seconds(self, rows: int) -> float:
        """Seconds of a plain step of ``rows`` single-token rows, greedy draws."""
        return self.plain.step_seconds(rows)


def profile_points(limit: int) -> list[int]:
    """Counts to profile up to ``limit``: the powers of two and the midpoints between them
    (1, 2, 3, 4, 6, 8, 12, ...), and ``limit`` itself."""
    points, p = {limit}, 1
    while p < limit:
        points.update(x for x in (p, p + p // 2) if x < limit)
        p *= 2
    return sorted(points)


def power_points(limit: int, base: int = 2) -> list[int]:
    """The powers of ``base`` below ``limit``, and ``limit`` itself (1, 2, 4, ..., limit)."""
    points, p = {limit}, 1
    while p < limit:
        points.add(p)
        p *= base
    return sorted(points)


def spread(rows: int, drafts: int) -> list[int]:
    """Tokens per row of a step of ``rows`` rows verifying ``drafts`` drafts in all, as even
    as they go (the first rows one longer)."""
    each, rest = divmod(drafts, rows)
    return [1 + each + (i < rest) for i in range(rows)]
