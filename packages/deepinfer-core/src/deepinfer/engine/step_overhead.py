"""What an engine step costs beyond its profiled passes, learnt from the steps themselves.

The start-up profile (:mod:`.verify_profile`, :mod:`.draft_cost`) times the model's passes and
the drafter's rounds on their own. An engine step also schedules, builds its batch, draws and
reads its tokens, rolls states back and hands out its outputs: host work that does not shrink
with the passes. On a GPU, where a replayed step takes a millisecond or two, that work is a
large part of the step, and a round of speculation, which emits several tokens a request for one
such overhead, is worth more than the passes alone say; a verification round's own host work
(draws of every position, rollbacks) is larger than a plain step's. So the wall time of each
decode-only step is compared with what the profile predicted for it, and the differences (one
running mean for plain steps, one for rounds) are added to the costs the schedule weighs. A step
is measured from its start to the start of the next one, and only when both are decode-only:
a prefill chunk is not priced by the profile, and a request arriving after an idle engine
comes with one, so an idle gap never counts as a step's time. A step that took more than
:data:`OUTLIER` times its predicted cost is a one-off (a CUDA graph captured on first use, a
pause of the host) and is not learnt: one such sample would price every later round out.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

#: Weight of a new measurement in the running means.
WEIGHT = 0.2
#: Steps slower than this many times their predicted cost are not learnt from.
OUTLIER = 4.0


@dataclass
class StepOverhead:
    """Running means of the seconds decode-only steps took beyond their predicted cost."""

    #: Plain steps' (None: none measured yet).
    plain: float | None = None
    #: Rounds' (a verification step and the drafting after it; None: none measured yet).
    round: float | None = None
    #: Rounds measured so far.
    rounds: int = 0
    #: The step in flight: its start, whether it is a round, its predicted seconds.
    _flight: tuple[float, bool, float] | None = None

    def begin(self, decode_only: bool) -> float:
        """A step starts now: the one before it ends here (measured if both are decode-only).
        Returns the start, to hand :meth:`launched` once the step's cost is known."""
        now = time.perf_counter()
        if self._flight is not None and decode_only:
            start, is_round, predicted = self._flight
            if now - start <= OUTLIER * predicted:
                self._learn(is_round, now - start - predicted)
        self._flight = None
        return now

    def launched(self, start: float, is_round: bool, predicted: float) -> None:
        """The step that began at ``start`` is a round (or a plain step), priced ``predicted``
        seconds by the profile."""
        self._flight = (start, is_round, predicted)

    def extra(self, is_round: bool) -> float:
        """Seconds to add to the profiled cost of a step (a round's: the plain steps' until
        a round was measured)."""
        found = self.round if is_round and self.round is not None else self.plain
        return found or 0.0

    def _learn(self, is_round: bool, seconds: float) -> None:
        old = self.round if is_round else self.plain
        new = seconds if old is None else old + (seconds - old) * WEIGHT
        if is_round:
            self.round = new
            self.rounds += 1
        else:
            self.plain = new
