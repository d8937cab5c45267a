"""What drafting has taught the adaptive schedule, kept apart per sampling regime.

The schedule (:mod:`.verify_schedule`) decides whether to draft a round on the mean survival
per draft position of the rows drafted lately, and recalibrates the drafter's confidences by how
its predictions have fared (:class:`~.online_calibration.OnlineCalibration`; the decisions to
draft have a calibration of their own). Acceptance depends on how a request samples: a greedy
request keeps a draft iff it is the target's argmax, a sampled one with the target's
probability of it, so the same drafter's rounds keep fewer drafts under sampling. Learnt from
one mean over all requests, a run of sampled requests would teach the schedule that drafting
does not pay and keep greedy requests that come after from drafting for a long while (what was
learnt ages back slowly, :data:`AGING`), and the other way round. So each regime, greedy
(temperature 0) and sampled, has its own :class:`Learnt`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from deepinfer.engine.online_calibration import OnlineCalibration

#: Pseudo-drafts, accepted as foreseen, that the drafting decisions' calibration starts from.
CALIBRATION_PRIOR = 8.0
#: Survivals before any round has been drafted, for a drafter that brings no measured
#: acceptance of its own (``acceptance_prior``): each draft half as likely as the one before
#: to be accepted (a guess under which a round of one request pays on a fast drafter and a
#: large batch's does not: the first rounds are no free trial).
PRIOR_SURVIVAL = 0.5
#: The least weight of a drafted row in the mean survival per position that drafting is
#: decided on: the mean averages the prior, counted as so many rows, with the rows drafted
#: since, until it holds ``1 / MEAN_WEIGHT`` of them, and then moves by this much a row.
MEAN_WEIGHT = 1 / 32
#: Rows the prior counts as: the guess a few (a handful of probe rounds then teach the mean
#: most of what a drafter really keeps), a measured acceptance a full mean's worth.
GUESS_ROWS = 4.0
MEASURED_ROWS = 1 / MEAN_WEIGHT
#: The share by which each round not drafted moves what was learnt (the mean survivals, the
#: calibrations' counts) back towards the prior: what came of drafting a while ago says less
#: of the text now, and an engine that never drafts again would never learn so.
AGING = 1 / 128


def sampled(temperature: float) -> bool:
    """The regime of a request sampling at ``temperature``: True for sampled, False for greedy."""
    return temperature > 0


def geometric_prior(n: int) -> list[float]:
    """:data:`PRIOR_SURVIVAL`'s survivals of ``n`` drafts."""
    return [PRIOR_SURVIVAL ** (j + 1) for j in range(n)]


@dataclass
class Learnt:
    """One regime's mean survivals and calibration counts."""

    #: Mean survival per draft position over the rows drafted lately, each row's confidences
    #: as :attr:`calibration` recalibrated them when it was planned: drafts expected to be
    #: kept, the units of :attr:`prior` (a measured acceptance).
    mean_survival: list[float] = field(default_factory=list)
    #: Survivals expected before any round: the drafter's acceptance per position measured
    #: on held-out text where it brings one (a guess that says drafting does not pay would
    #: never be put to the test), :func:`geometric_prior` past it.
    prior: list[float] = field(default_factory=list)
    #: Rows the prior counts as (:data:`GUESS_ROWS`, or :data:`MEASURED_ROWS` for a measured
    #: acceptance), and rows the mean holds: the prior's and those learnt since, aged back
    #: towards the prior's like the rest.
    prior_rows: float = GUESS_ROWS
    rows: float = GUESS_ROWS
    #: The confidences' calibration per draft position, learnt from what verification kept.
    calibration: OnlineCalibration = field(default_factory=OnlineCalibration)
    #: Survival that decisions to draft counted on, and drafts those rounds then had accepted
    #: (:attr:`draft_calibration`).
    foreseen: float = 0.0
    realized: float = 0.0

    def survivals(self, n: int) -> list[float]:
        """The survivals a round of ``n`` drafts is expected to have: the mean over the rows
        drafted lately, the prior's where there is none."""
        return self.mean_survival[:n] + self.prior_survivals(n)[len(self.mean_survival) :]

    def prior_survivals(self, n: int) -> list[float]:
        """The prior's survivals of ``n`` drafts."""
        return (self.prior + geometric_prior(n)[len(self.prior) :])[:n]

    def learn(self, row: list[float]) -> None:
        """Take a drafted row's survivals into the mean (at least :data:`MEAN_WEIGHT`)."""
        self.rows += 1
        weight = max(MEAN_WEIGHT, 1 / self.rows)
        mean = self.survivals(max(len(row), len(self.mean_survival)))
        for j, a in enumerate(row):
            mean[j] += (a - mean[j]) * weight
        self.mean_survival = mean

    def age(self, k: int) -> None:
        """Move what was learnt towards the prior by :data:`AGING` (see there)."""
        keep = 1 - AGING
        prior = self.prior_survivals(k)
        mean = self.survivals(k)
        self.mean_survival = [p + (a - p) * keep for a, p in zip(mean, prior, strict=True)]
        self.rows = self.prior_rows + (self.rows - self.prior_rows) * keep
        self.foreseen, self.realized = self.foreseen * keep, self.realized * keep

    @property
    def draft_calibration(self) -> float:
        """Drafts accepted per unit of survival the decisions to draft counted on, at most 1,
        with the same prior: those decisions count on mean survivals, which the rounds they
        draft then meet with their own (a round's plan verifies the drafts it finds worth it,
        not the mean), so they are checked against what those rounds kept. Its prior is the
        stronger of :data:`CALIBRATION_PRIOR` and the drafts the prior's own rows expect: a
        round keeps anything from none to every draft, so with a measured acceptance behind
        the mean a few unlucky rounds must not outweigh it (they would stop drafting for as
        long as aging takes to bring it back)."""
        prior = max(CALIBRATION_PRIOR, self.prior_rows * sum(self.prior))
        return min(1.0, (self.realized + prior) / (self.foreseen + prior))
