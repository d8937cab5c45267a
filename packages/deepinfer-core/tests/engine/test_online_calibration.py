"""Online draft-confidence calibration against counts worked by hand and a statistical check:
drafts kept at a rate their raw confidence misstates come out at that rate."""

from __future__ import annotations

import math
import random

from deepinfer.engine import online_calibration
from deepinfer.engine.online_calibration import (
    POSITION_PRIOR,
    PRIOR_TRIALS,
    OnlineCalibration,
    bin_of,
)


def test_bins_split_the_logit_range_evenly() -> None:
    """16 bins over logits [-8, 8], one logit wide; the ends take everything beyond."""
    assert bin_of(0.5) == 8  # logit 0: the first bin of the upper half
    assert bin_of(1 / (1 + math.exp(0.5))) == 7  # logit -0.5
    assert bin_of(1e-9) == 0 and bin_of(1 - 1e-9) == 15


def test_trials_and_hits_follow_the_kept_prefix() -> None:
    """A row of three drafts that kept one: positions 0 and 1 were tried, 0 kept."""
    cal = OnlineCalibration()
    cal.observe([0.9, 0.5, 0.2], trials=2, hits=1)
    assert cal.trials.shape == (2, 16)
    assert cal.trials[0, bin_of(0.9)] == 1 and cal.trials[1, bin_of(0.5)] == 1
    assert cal.hits[0, bin_of(0.9)] == 1 and cal.hits[1].sum() == 0
    # position 1's bin: (0 + 8 * 0.5 * s) / (1 + 8), s its scale (0 + 4) / (0.5 + 4) (no
    # hit where 0.5 were expected); untried position 2 stays raw
    s1 = 4 / 4.5
    got = cal.calibrate([0.9, 0.5, 0.2])
    assert math.isclose(got[1], 8 * 0.5 * s1 / 9) and got[2] == 0.2
    cal.observe([0.9], trials=1, hits=0)
    assert math.isclose(cal.trials[0, bin_of(0.9)], 1 * online_calibration.DECAY + 1)


def test_an_under_confident_drafter_is_read_at_its_kept_rate() -> None:
    """First drafts of confidence 0.3 (a bin whose temperature scaling would stay below one
    half) kept 60% of the time, 2,000 rows: the calibrated confidence is within 0.05 of 0.6
    (the decayed counts hold about 865 trials; three standard errors are 0.05)."""
    rng = random.Random(0)
    cal = OnlineCalibration()
    for _ in range(2000):
        cal.observe([0.3], trials=1, hits=int(rng.random() < 0.6))
    got = cal.calibrate([0.3])[0]
    trials = cal.trials.sum()
    assert abs(got - 0.6) < 3 * math.sqrt(0.24 / trials) + PRIOR_TRIALS * 0.3 / trials


def test_a_position_scale_lifts_bins_that_have_seen_few_trials() -> None:
    """An under-confident drafter: first drafts of confidence c (spread over [0.05, 0.45],
    three bins) kept with chance 2c, 24 rows. A bin's prior is its confidence times the
    position's found over expected hits (recomputed here in float64 from the rows, decayed),
    so a confidence of 0.35 (kept with chance 0.7) reads much nearer 0.7 than 0.35 though its
    bin has seen about as many trials as its prior counts; a position with no trial reads raw."""
    rng = random.Random(1)
    cal = OnlineCalibration()
    found = expected = 0.0
    for _ in range(24):
        c = rng.uniform(0.05, 0.45)
        kept = rng.random() < 2 * c
        cal.observe([c], trials=1, hits=int(kept))
        found = found * online_calibration.DECAY + kept
        expected = expected * online_calibration.DECAY + c
    scale = (found + POSITION_PRIOR) / (expected + POSITION_PRIOR)
    b = bin_of(0.35)
    t, h = cal.trials[0, b], cal.hits[0, b]
    want = (h + PRIOR_TRIALS * min(1.0, 0.35 * scale)) / (t + PRIOR_TRIALS)
    got = cal.calibrate([0.35, 0.35])
    assert math.isclose(got[0], want) and got[1] == 0.35
    assert t <= 1.5 * PRIOR_TRIALS and abs(got[0] - 0.7) < 0.35 / 2, (t, got)
