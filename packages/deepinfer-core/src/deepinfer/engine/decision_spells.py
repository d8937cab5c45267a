"""How long the adaptive schedule's decision whether to draft stands before it weighs again.

Weighing whether a batch should draft (:meth:`.verify_schedule.AdaptiveVerifier.drafting_pays`)
costs host time in proportion to its rows, before every step: a share of a plain step at large
batches on a GPU, where drafting seldom pays, and a few percent of a round at small ones. Its
answer moves only as fast as what was learnt does (a round's outcome, aging), so a finding
stands for a few steps of the same batch (as many rows, as many of them sampled, the same k):

* not paying: one step, then twice as many after each such finding in a row for that batch,
  up to :data:`QUIET_STEPS` (each step still counts as a round not drafted, and ages);
* paying: :data:`STEADY_STEPS` steps, drafted with the lengths that finding chose.

A batch of other rows is weighed at once.
"""

from __future__ import annotations

from dataclasses import dataclass

#: The longest quiet spell after a batch found not to pay.
QUIET_STEPS = 8
#: Steps a batch found to pay is drafted on that finding before it is weighed again.
STEADY_STEPS = 4

#: (rows, sampled rows, k): what a finding is about
Batch = tuple[int, int, int]


@dataclass(frozen=True)
class Finding:
    """What weighing a batch found: whether it pays and, if so, each regime's cumulative
    survivals (True: sampled) and the lengths it drafts, by request."""

    batch: Batch
    counted: dict[bool, list[float]] | None = None
    lengths: list[int] | None = None

    @property
    def pays(self) -> bool:
        return self.lengths is not None


class DecisionSpells:
    """The latest finding and the steps it still stands for."""

    def __init__(self) -> None:
        self.latest: Finding | None = None
        self._left = 0
        self._quiet = 0  # the length of the latest quiet spell

    def standing(self, batch: Batch) -> Finding | None:
        """The finding that still stands for ``batch`` (a step of its spell spent), if any."""
        if self._left and self.latest is not None and self.latest.batch == batch:
            self._left -= 1
            return self.latest
        return None

    def found(self, finding: Finding) -> None:
        """Take in a new finding and start its spell."""
        if finding.pays:
            self._quiet, self._left = 0, STEADY_STEPS
        else:
            latest = self.latest
            again = latest is not None and not latest.pays and latest.batch == finding.batch
            self._quiet = self._left = min(2 * self._quiet if again else 1, QUIET_STEPS)
        self.latest = finding
