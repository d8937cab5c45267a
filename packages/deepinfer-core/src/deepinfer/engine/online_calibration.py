"""Online calibration of draft confidences, per draft position (after ``dspark.md`` §6.6).

A drafter's confidence ``c_k`` in its draft k (the chance that the draft survives if the drafts
before it did) is rarely calibrated: DSpark's raw head is over-confident, the MTP layer's
softmax probability of its argmax under-confident (first drafts of 0.1-0.5 are kept more often
than not). The adaptive schedule prices drafts by the survivals ``prod_{i<=k} c_i``, so an
under-confident drafter is never verified and an over-confident one is verified where it does
not pay.

vLLM calibrates DSpark's head online by a temperature per position on the confidence logit
(Sequential Temperature Scaling). A temperature keeps the logit's sign, so it cannot lift a
confidence of 0.3 that is kept 60% of the time above one half, and the MTP layer's are mostly
of that kind. So here each position keeps vLLM's counts (trials and hits, decayed by
:data:`DECAY` a row observed, in :data:`BINS` bins of the confidence logit over [-8, 8]) and
reads the calibrated confidence off its bin: the bin's hit rate, with :data:`PRIOR_TRIALS`
pseudo-trials at the raw confidence scaled by its position's hit rate over its expected one
(all bins together: hits over the sum of the tried drafts' raw confidences, with
:data:`POSITION_PRIOR` pseudo-hits as expected). A bin needs a few trials of its own to move,
and an under-confident drafter's confidences spread over many bins, so the position's scale
is what lifts a bin early on (histogram binning over a per-position scaling; before any trial,
the identity).

What it learns from are *trials*: a draft whose predecessors were all kept, checked against the
target. A row of ``l`` drafts whose first ``m`` were drawn as drafted is a trial at positions
``k < min(m + 1, l)`` and a hit at ``k < m``; the drafts its plan cut count as well, each
judged by the token the request drew at its position later (:mod:`.draft_trials`). Without
them, rows trimmed to nothing would teach nothing, and an under-confident drafter would stay
unverified for good.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence

import numpy as np

#: Bins of the confidence logit, over [-LOGIT_RANGE, LOGIT_RANGE] (vLLM's online STS).
BINS = 16
LOGIT_RANGE = 8.0
#: Weight kept by the counts at each row observed: recent rounds count most.
DECAY = 0.999
#: Pseudo-trials at the (position-scaled) raw confidence in every bin: a bin's first trials
#: move it gradually.
PRIOR_TRIALS = 8.0
#: Pseudo-hits, as many as expected, in a position's scale: its first rows move it gradually.
POSITION_PRIOR = 4.0
#: Confidences are clipped this far from 0 and 1 before their logit is taken.
EPS = 1e-6

#: The bins' inner edges, as floats: a bin is looked up for every draft of every planned row,
#: which numpy's per-call overhead made a few milliseconds a step at a batch of 256.
_INNER_EDGES = np.linspace(-LOGIT_RANGE, LOGIT_RANGE, BINS + 1)[1:-1].tolist()


def bin_of(c: float) -> int:
    """The bin of confidence ``c``'s logit."""
    c = min(max(c, EPS), 1 - EPS)
    return bisect.bisect_right(_INNER_EDGES, math.log(c / (1 - c)))


class OnlineCalibration:
    """Per-position, per-bin trials and hits of one stream of rows (a sampling regime)."""

    def __init__(self) -> None:
        self.trials = np.zeros((0, BINS))
        self.hits = np.zeros((0, BINS))
        #: Per position, the sum of the tried drafts' raw confidences (decayed as the counts).
        self.expected = np.zeros(0)
        #: The counts as Python lists, and each position's scale, made once after the counts
        #: change: every draft of every planned row reads them, where numpy's per-element
        #: indexing costs most.
        self._read: tuple[list[list[float]], list[list[float]], list[float]] | None = None

    def observe(self, confidences: Sequence[float], trials: int, hits: int, start: int = 0) -> None:
        """A row's conditional ``confidences`` and its outcome at positions ``start <= k <
        trials``: each was tried (its predecessors kept), and kept where ``k < hits``. A row's
        positions may come in pieces as they are judged (``start`` > 0 after the first);
        the counts decay once a row, with its first piece."""
        n = min(trials, len(confidences))
        if n <= start:
            return
        if n > self.trials.shape[0]:
            grow = ((0, n - self.trials.shape[0]), (0, 0))
            self.trials, self.hits = np.pad(self.trials, grow), np.pad(self.hits, grow)
            self.expected = np.pad(self.expected, grow[0])
        if start == 0:
            self.trials *= DECAY
            self.hits *= DECAY
            self.expected *= DECAY
        for k in range(start, n):
            b = bin_of(confidences[k])
            self.trials[k, b] += 1
            self.hits[k, b] += k < hits
            self.expected[k] += confidences[k]
        self._read = None

    @property
    def first_trials(self) -> float:
        """First drafts tried (decayed)."""
        return float(self.trials[0].sum()) if len(self.trials) else 0.0

    def _counts(self) -> tuple[list[list[float]], list[list[float]], list[float]]:
        """The counts and each position's scale as Python lists (made once a change)."""
        if self._read is None:
            found = self.hits.sum(axis=1) + POSITION_PRIOR
            scale = (found / (self.expected + POSITION_PRIOR)).tolist() or [1.0]
            self._read = (self.trials.tolist(), self.hits.tolist(), scale)
        return self._read

    def scale(self) -> list[float]:
        """Each position's hit rate over its expected one (see the module; 1 before any)."""
        return self._counts()[2]

    def calibrate(self, confidences: Sequence[float]) -> list[float]:
        """Each confidence read off its position's bin (see the module)."""
        trials, hits, scale = self._counts()
        out = []
        for k, c in enumerate(confidences):
            if k >= len(trials):
                out.append(float(c))
                continue
            b = bin_of(c)
            t, h = trials[k][b], hits[k][b]
            prior = min(1.0, c * scale[k])
            out.append(float((h + PRIOR_TRIALS * prior) / (t + PRIOR_TRIALS)))
        return out
