"""Every call owns its requests: streams and ``generate`` calls interleave in any order and each
stream ends with its final output; an interrupted call leaves nothing behind."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reference import greedy_reference

from deepinfer.llm import LLM
from deepinfer.outputs import RequestOutput
from deepinfer.sampling_params import SamplingParams

PROMPTS = ["ROMEO:", "JULIET:", "HAMLET:", "To be, or not"]


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM("tiny", device="cpu")


@functools.cache
def expected(llm: LLM, prompt: str, n: int) -> tuple[int, ...]:
    ids = llm.tokenizer.encode(prompt, add_special_tokens=False).ids
    return tuple(greedy_reference(llm.engine.model, ids, n, eos=1))


def params(n: int) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=n)


def drain(stream: Iterator[RequestOutput]) -> RequestOutput:
    last = None
    for last in stream:  # noqa: B007
        pass
    assert last is not None
    return last


def assert_idle(llm: LLM) -> None:
    assert not llm.engine.has_unfinished_requests() and not llm.engine.groups
    assert not llm._owned and not llm._latest and not llm._streaming


def test_generate_inside_a_stream_loop(llm: LLM) -> None:
    """The stream's request finishes during the inner ``generate``'s steps; the stream still
    ends with its final output."""
    stream = llm.stream("ROMEO:", params(4))
    first = next(stream)
    assert not first.finished
    (other,) = llm.generate("JULIET:", params(12), use_tqdm=False)
    assert tuple(other.outputs[0].token_ids) == expected(llm, "JULIET:", 12)
    final = drain(stream)
    assert final.finished
    assert tuple(final.outputs[0].token_ids) == expected(llm, "ROMEO:", 4)
    assert_idle(llm)


def test_two_streams_advanced_alternately(llm: LLM) -> None:
    a, b = llm.stream("ROMEO:", params(3)), llm.stream("HAMLET:", params(7))
    last: dict[str, RequestOutput] = {}
    live = {"a": a, "b": b}
    while live:
        for name, stream in list(live.items()):
            try:
                last[name] = next(stream)
            except StopIteration:
                del live[name]
    assert last["a"].finished and last["b"].finished
    assert tuple(last["a"].outputs[0].token_ids) == expected(llm, "ROMEO:", 3)
    assert tuple(last["b"].outputs[0].token_ids) == expected(llm, "HAMLET:", 7)
    assert_idle(llm)


_ACTIONS = st.lists(
    st.one_of(
        st.tuples(st.just("open"), st.integers(0, 3), st.integers(1, 6)),
        st.tuples(st.just("next"), st.integers(0, 3), st.just(0)),
        st.tuples(st.just("close"), st.integers(0, 3), st.just(0)),
        st.tuples(st.just("generate"), st.integers(0, 3), st.integers(1, 6)),
    ),
    max_size=14,
)


@settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(actions=_ACTIONS)
def test_any_interleaving_ends_every_stream(llm: LLM, actions: list[tuple[str, int, int]]) -> None:
    """Random programs of stream openings, advances, closes and ``generate`` calls: every
    stream left open ends with its final output, equal to the reference; nothing is left."""
    streams: dict[int, tuple[Iterator[RequestOutput], str, int]] = {}
    for action, slot, n in actions:
        prompt = PROMPTS[slot]
        if action == "open" and slot not in streams:
            streams[slot] = (llm.stream(prompt, params(n)), prompt, n)
        elif action == "next" and slot in streams:
            stream, p, k = streams[slot]
            out = next(stream, None)
            if out is None or out.finished:
                del streams[slot]
                if out is not None:
                    assert tuple(out.outputs[0].token_ids) == expected(llm, p, k)
        elif action == "close" and slot in streams:
            streams.pop(slot)[0].close()  # aborts its request
        elif action == "generate":
            (out,) = llm.generate(prompt, params(n), use_tqdm=False)
            assert tuple(out.outputs[0].token_ids) == expected(llm, prompt, n)
    for stream, prompt, n in streams.values():
        final = drain(stream)
        assert final.finished
        assert tuple(final.outputs[0].token_ids) == expected(llm, prompt, n)
    assert_idle(llm)


_INTERRUPTED = textwrap.dedent(
    """
    import json, sys
    from deepinfer.llm import LLM
    from deepinfer.sampling_params import SamplingParams

    llm = LLM("tiny", device="cpu")
    params = SamplingParams(temperature=0, max_tokens=3000, ignore_eos=True)
    print("ready", flush=True)
    try:
        llm.generate(["ROMEO:"] * 16, params, use_tqdm=False)
        print(json.dumps({"interrupted": False}), flush=True)
        sys.exit(0)
    except KeyboardInterrupt:
        pass
    engine = llm.engine
    left = {
        "interrupted": True,
        "unfinished": engine.has_unfinished_requests(),
        "groups": len(engine.groups),
        "used_bytes": engine.pool.used_bytes,
    }
    (out,) = llm.generate("JULIET:", SamplingParams(temperature=0, max_tokens=6), use_tqdm=False)
    left["tokens"] = out.outputs[0].token_ids
    print(json.dumps(left), flush=True)
    """
)


def test_ctrl_c_inside_generate_leaves_nothing_queued(llm: LLM) -> None:
    """SIGINT sent to a process running ``generate``: the call raises KeyboardInterrupt with
    nothing left queued, and the same LLM serves the next call correctly."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _INTERRUPTED],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=1.5)  # let it get well into the generation
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    left = json.loads(out.strip().splitlines()[-1])
    assert left["interrupted"], "the generation finished before the signal"
    assert (left["unfinished"], left["groups"], left["used_bytes"]) == (False, 0, 0)
    assert tuple(left["tokens"]) == expected(llm, "JULIET:", 6)
