"""The step cost: the running max, the lookups of a curve and of plain and verification steps
against hand-computed values, the profiling ladder and a profile of the tiny model (its shape,
and a verification step never priced below the plain step of its rows), and the
``speculative_config`` options that select and price the schedule (the verify, plain and draft
cost tables)."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from deepinfer.assets import tiny_model
from deepinfer.engine.spec_config import SpeculativeConfig
from deepinfer.engine.verify_cost import (
    StepCost,
    VerifyCost,
    power_points,
    profile_points,
    spread,
)
from deepinfer.engine.verify_profile import draft_counts, monotone_curve, profile_step_cost
from deepinfer.errors import InvalidRequestError


def test_a_table_is_made_non_decreasing_by_a_running_max() -> None:
    cost = VerifyCost.from_table({8: 2.5, 1: 1.0, 4: 2.0, 2: 3.0, 16: 4.0})
    assert cost.tokens == (1, 2, 4, 8, 16)
    assert cost.seconds == (1.0, 3.0, 3.0, 3.0, 4.0)
    assert cost.as_dict() == {1: 1.0, 2: 3.0, 4: 3.0, 8: 3.0, 16: 4.0}


def test_lookup_interpolates_and_extrapolates() -> None:
    cost = VerifyCost.from_table({1: 1.0, 3: 2.0, 7: 4.0})
    want = {0: 1.0, 1: 1.0, 2: 1.5, 3: 2.0, 4: 2.5, 5: 3.0, 7: 4.0, 9: 5.0, 15: 8.0}
    assert {n: cost.step_seconds(n) for n in want} == want
    assert cost.steps_per_second(9) == 0.2
    flat = VerifyCost.from_table({4: 0.5})
    assert [flat.step_seconds(n) for n in (1, 4, 100)] == [0.5, 0.5, 0.5]


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(st.dictionaries(st.integers(1, 64), st.floats(1e-4, 10.0), min_size=1, max_size=8))
def test_every_table_looks_up_non_decreasing(table: dict[int, float]) -> None:
    cost = VerifyCost.from_table(table)
    for n, s in cost.as_dict().items():  # each point: the largest time at or below it
        assert s == max(v for m, v in table.items() if m <= n)
    lookups = [cost.step_seconds(n) for n in range(1, 80)]
    assert all(a <= b for a, b in itertools.pairwise(lookups))


@pytest.mark.parametrize("table", [{}, {0: 1.0}, {2: 0.0}, {2: float("inf")}, {True: 1.0}])
def test_bad_tables_are_refused(table: dict[int, float]) -> None:
    with pytest.raises(ValueError, match="verify cost"):
        VerifyCost.from_table(table)


def test_a_step_cost_prices_plain_and_verification_steps_apart() -> None:
    """Rows 1 and 4 measured: a plain step by rows, a verification step by tokens at each;
    in between, the two looked up at the same tokens per row and interpolated in rows."""
    plain = VerifyCost.from_table({1: 1.0, 4: 2.0})
    one = VerifyCost.from_table({2: 3.0, 3: 4.0})
    four = VerifyCost.from_table({5: 5.0, 8: 8.0, 12: 12.0})
    cost = StepCost(plain, (one, four), (1, 4))
    assert [cost.seconds(r, r) for r in (1, 2, 4)] == [1.0, 1.0 + 1 / 3, 2.0]  # plain steps
    assert cost.plain_seconds(4) == 2.0
    assert [cost.seconds(1, t) for t in (2, 3, 5)] == [3.0, 4.0, 6.0]  # past 3: the slope
    assert [cost.seconds(4, t) for t in (5, 6, 8, 12)] == [5.0, 6.0, 8.0, 12.0]
    # 2 rows, 2 tokens a row: 3.0 at 1 row (2 tokens), 8.0 at 4 rows (8); a third of the way
    assert math.isclose(cost.seconds(2, 4), 3.0 + 5.0 / 3)
    # 8 rows, 2 a row: the line through those two, at 8 rows; never below the 4-row step
    assert math.isclose(cost.seconds(8, 16), 3.0 + 5.0 * 7 / 3)
    assert cost.seconds(8, 9) >= cost.seconds(4, 5)
    # a table by tokens prices every step by its tokens, its plain step too unless given
    table = VerifyCost.from_table({1: 1.0, 3: 2.0, 7: 4.0})
    assert StepCost.by_tokens(table).seconds(3, 3) == 2.0
    assert StepCost.by_tokens(table).seconds(3, 5) == 3.0
    assert StepCost.by_tokens(table, plain).seconds(4, 4) == 2.0
    assert StepCost.by_tokens(table, plain).seconds(1, 5) == 3.0
    with pytest.raises(ValueError, match="one verification curve per row count"):
        StepCost(plain, (one,), (1, 4))
    # draws with noise add their own curve, by positions drawn so (none: nothing)
    noisy = StepCost(plain, (one, four), (1, 4), VerifyCost.from_table({1: 0.5, 3: 1.5}))
    assert [noisy.seconds(4, 8, n) for n in (0, 1, 2, 5)] == [8.0, 8.5, 9.0, 10.5]
    assert noisy.seconds(1, 1, 1) == 1.5 and cost.seconds(1, 1, 3) == 1.0


def test_a_profiled_curve_pools_points_out_of_order() -> None:
    """The least-squares non-decreasing fit, by hand: 3 then 1 pool to 2 (and the 2 after them
    stays); a running max would have made every later point at least 3."""
    curve = monotone_curve({1: 3.0, 2: 1.0, 4: 2.0, 8: 5.0, 16: 4.0, 32: 4.5})
    assert curve.as_dict() == {1: 2.0, 2: 2.0, 4: 2.0, 8: 4.5, 16: 4.5, 32: 4.5}
    assert monotone_curve({1: 1.0, 2: 2.0}).as_dict() == {1: 1.0, 2: 2.0}


def test_profile_points_and_rows() -> None:
    assert profile_points(128) == [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128]
    assert profile_points(10) == [1, 2, 3, 4, 6, 8, 10]
    assert profile_points(1) == [1]
    assert power_points(64) == [1, 2, 4, 8, 16, 32, 64]
    assert power_points(48) == [1, 2, 4, 8, 16, 32, 48]
    assert power_points(1) == [1]
    assert draft_counts(4, 5) == [1, 4, 8, 20]
    assert draft_counts(1, 5) == [1, 2, 5]
    assert draft_counts(3, 1) == [1, 3]
    assert spread(3, 7) == [4, 3, 3]
    assert spread(4, 1) == [2, 1, 1, 1]
    assert spread(2, 0) == [1, 1]


def test_a_profile_of_the_tiny_model() -> None:
    """Three rows at most, two drafts each: rows 1, 2 and 3 measured, each at its ladder of
    drafts, and draws with noise at 1, 8 and 9 positions; every curve non-decreasing, and no
    verification step below the plain step of its rows. The profile leaves the model as it
    was (no hooks left)."""
    model = tiny_model(torch.float32)
    cost = profile_step_cost(model, 2, 3, feature_layers=(1,), repeats=1)
    assert cost.rows == (1, 2, 3) and cost.plain.tokens == (1, 2, 3)
    assert [c.tokens for c in cost.verify] == [(2, 3), (3, 4, 6), (4, 6, 9)]
    for rows, curve in zip(cost.rows, cost.verify, strict=True):
        assert all(a <= b for a, b in itertools.pairwise(curve.seconds))
        assert curve.seconds[0] >= cost.plain_seconds(rows)
    assert all(a <= b for a, b in itertools.pairwise(cost.plain.seconds))
    assert cost.draws is not None and cost.draws.tokens == (1, 8, 9)  # up to 3 rows of 3
    assert all(a <= b for a, b in itertools.pairwise(cost.draws.seconds))
    assert not any(layer._forward_hooks for layer in model.layers)


def _parse(**options: object) -> SpeculativeConfig:
    config = SpeculativeConfig.parse({"method": "dspark", "num_speculative_tokens": 5, **options})
    assert config is not None
    return config


def test_the_schedule_options() -> None:
    assert _parse().scheduling == "fixed"
    assert _parse(scheduling="adaptive").scheduling == "adaptive"
    assert _parse(enable_adaptive_verification=True).scheduling == "adaptive"
    assert _parse(enable_adaptive_verification=False).scheduling == "fixed"
    both = _parse(scheduling="adaptive", enable_adaptive_verification=True)
    assert both.scheduling == "adaptive" and both.verify_cost is None
    priced = _parse(scheduling="adaptive", verify_cost={"4": 2.0, 1: 1})  # JSON keys are strings
    assert priced.verify_cost == ((1, 1.0), (4, 2.0)) and priced.draft_cost is None
    drafted = _parse(scheduling="adaptive", draft_cost={"8": 0.5, 1: 0.1})
    assert drafted.draft_cost == ((1, 0.1), (8, 0.5)) and drafted.verify_cost is None
    plain = _parse(scheduling="adaptive", plain_cost={"2": 0.5})
    assert plain.plain_cost == ((2, 0.5),) and plain.verify_cost is None


@pytest.mark.parametrize(
    ("options", "names"),
    [
        ({"scheduling": "fixed", "enable_adaptive_verification": True}, "enable_adaptive"),
        ({"scheduling": "adaptive", "enable_adaptive_verification": False}, "enable_adaptive"),
        ({"scheduling": "adaptive", "confidence_threshold": 0.3}, "confidence_threshold"),
        ({"enable_adaptive_verification": True, "confidence_threshold": 0.3}, "confidence_thr"),
        ({"verify_cost": {1: 1.0}}, "verify_cost"),
        ({"scheduling": "adaptive", "verify_cost": {0: 1.0}}, "verify_cost"),
        ({"scheduling": "adaptive", "verify_cost": {1: -1.0}}, "verify_cost"),
        ({"scheduling": "adaptive", "verify_cost": [1.0]}, "verify_cost"),
        ({"draft_cost": {1: 1.0}}, "draft_cost"),
        ({"scheduling": "adaptive", "draft_cost": {0: 1.0}}, "draft_cost maps requests"),
        ({"scheduling": "adaptive", "draft_cost": {}}, "draft_cost"),
        ({"plain_cost": {1: 1.0}}, "plain_cost"),
        ({"scheduling": "adaptive", "plain_cost": {0: 1.0}}, "plain_cost maps rows"),
        ({"scheduling": "greedy"}, "scheduling"),
        ({"enable_adaptive_verification": "yes"}, "enable_adaptive_verification"),
    ],
)
def test_contradictory_or_bad_schedule_options_are_refused(
    options: dict[str, object], names: str
) -> None:
    with pytest.raises(InvalidRequestError, match=f"speculative_config: .*{names}"):
        _parse(**options)
