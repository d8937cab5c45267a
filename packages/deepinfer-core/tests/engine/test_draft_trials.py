"""Draft trials judged by the tokens drawn after, against the outcome read off the whole token
stream at once: a row of drafts d_0.. d_{l-1} at positions p.. p+l-1 of a stream t is kept up
to its first j with d_j != t_{p+j} (a trial at 0..j, hits at 0..j-1), or whole if there is
none; however the stream arrives in steps (each step's verdicts a piece), and beside other
rows' trials."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from deepinfer.engine.draft_trials import DraftTrials
from deepinfer.engine.request import Request, RequestStatus
from deepinfer.outputs import RequestMetrics
from deepinfer.sampling_params import SamplingParams


def _request(name: str) -> Request:
    return Request(name, name, 0, [1, 2], SamplingParams(max_tokens=64), 0, RequestMetrics(0), 3)


def _expected(offered: list[int], stream: list[int], first: int) -> tuple[int, int] | None:
    """(trials, hits) of ``offered`` at ``first`` in ``stream`` (None: not decided yet)."""
    for j, d in enumerate(offered):
        if first + j >= len(stream):
            return None
        if stream[first + j] != d:
            return j + 1, j
    return len(offered), len(offered)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(0, 2), min_size=4, max_size=24),
    st.lists(
        st.tuples(st.integers(0, 8), st.lists(st.integers(0, 2), min_size=1, max_size=5)),
        min_size=1,
        max_size=4,
    ),
    st.lists(st.integers(1, 4), min_size=1, max_size=24),
)
def test_trials_end_where_the_stream_first_differs(
    stream: list[int], rows: list[tuple[int, list[int]]], steps: list[int]
) -> None:
    """``rows``: (position, drafts) planned before any token is drawn; the stream then
    arrives in steps of the sizes ``steps`` cycles through. Each row's outcome (confidences
    passed through) equals the one read off the stream; undecided rows stay open."""
    trials, req = DraftTrials(), _request("r")
    for i, (first, offered) in enumerate(rows):
        trials.plan(req, [i / 10] * len(offered), offered, first)
    got: dict[float, tuple[int, int]] = {}  # a trial's pieces put together
    at, s = 0, 0
    while at < len(stream):
        n = steps[s % len(steps)]
        for trial, start, tried in trials.drawn(req, stream[at : at + n], at):
            key = trial.confidence[0]
            assert start == got.get(key, (0, 0))[0] < tried  # pieces follow each other
            got[key] = (tried, trial.judged)
        at, s = at + n, s + 1
    for i, (first, offered) in enumerate(rows):
        want = _expected(offered, stream, first)
        if want is None:  # open: its pieces so far are the drafts drawn as drafted
            want = (len(stream) - first,) * 2 if len(stream) > first else None
        assert got.get(i / 10) == want, (i, first, offered)
    still = sum(_expected(o, stream, f) is None for f, o in rows)
    assert len(trials.open.get(req, [])) == still


def test_a_finished_requests_trials_are_dropped_and_only_its_own() -> None:
    """A trial whose request finishes is dropped (its judged drafts were counted as they were
    judged); another request's trial stays open."""
    trials, done, going = DraftTrials(), _request("done"), _request("going")
    trials.plan(done, [0.3, 0.4, 0.5], [7, 8, 9], 3)
    trials.plan(going, [0.1], [7], 3)
    ((trial, start, tried),) = trials.drawn(done, [7, 8], 3)
    assert (trial.confidence, start, tried, trial.judged) == ([0.3, 0.4, 0.5], 0, 2, 2)
    done.status = RequestStatus.FINISHED
    trials.forget_finished()
    assert list(trials.open) == [going]


def test_tokens_past_a_trials_positions_end_it_where_it_stands() -> None:
    """Tokens that start after a trial's next position (positions it never saw: the request
    was preempted and recomputed) end it at the drafts judged so far."""
    trials, req = DraftTrials(), _request("r")
    trials.plan(req, [0.5, 0.5, 0.5], [4, 4, 4], 10)
    ((trial, start, tried),) = trials.drawn(req, [4], 10)
    assert (start, tried, trial.judged) == (0, 1, 1)
    assert list(trials.drawn(req, [4], 12)) == []
    assert not trials.open
