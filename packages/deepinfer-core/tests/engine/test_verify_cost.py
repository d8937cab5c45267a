"""The verify cost table: the running max, the lookup against hand-computed values, the
profiling ladder, and the ``speculative_config`` options that select and price the schedule
(the verify and the draft cost tables)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deepinfer.engine.speculative import SpeculativeConfig
from deepinfer.engine.verify_cost import VerifyCost, profile_points, row_lengths
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


def test_profile_points_and_rows() -> None:
    assert profile_points(128) == [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128]
    assert profile_points(10) == [1, 2, 3, 4, 6, 8, 10]
    assert profile_points(1) == [1]
    assert row_lengths(13, 6) == [6, 6, 1]
    assert row_lengths(12, 6) == [6, 6]


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
        ({"scheduling": "greedy"}, "scheduling"),
        ({"enable_adaptive_verification": "yes"}, "enable_adaptive_verification"),
    ],
)
def test_contradictory_or_bad_schedule_options_are_refused(
    options: dict[str, object], names: str
) -> None:
    with pytest.raises(InvalidRequestError, match=f"speculative_config: .*{names}"):
        _parse(**options)
