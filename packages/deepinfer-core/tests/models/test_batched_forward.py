"""Continuous-batching steps equal one step per sequence.

A batch of prefill chunks (one packed [1, N] pass) and a batch of decode rows (one token per
sequence, each at its own position) must leave every sequence exactly where separate
single-sequence steps leave it; the single-sequence ``forward`` is itself checked against
transformers (V4) and float64 re-implementations (V4.1) in the other model tests. The sequences
are driven past the sliding window, past index_topk compressed entries and through every
compressor phase, so ring wrap-around, per-row visibility and top-k selection all matter.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest
import torch
from _tiny_models import text_ids, tiny_models

from deepinfer.cache.slots import StateSlots
from deepinfer.models import ragged
from deepinfer.models.batch import ForwardBatch, SequenceSpan
from deepinfer.models.causal_lm import DeepseekCausalLM as DeepseekV4ForCausalLM
from deepinfer.models.state import ModelState
from deepinfer.models.state_views import clone_state

CHUNK_LENGTHS = (1, 2, 3, 5, 17, 40, 70, 129)


@pytest.fixture(scope="module", params=tiny_models(seed=3), ids=lambda m: m[0])
def model(request: pytest.FixtureRequest) -> DeepseekV4ForCausalLM:
    return request.param[1]


def test_packed_and_decode_batches_equal_separate_forwards(model: DeepseekV4ForCausalLM) -> None:
    _check_against_separate(model, model.new_state, release=None, clone=None, rounds=6)


def test_slotted_states_equal_separate_forwards(model: DeepseekV4ForCausalLM) -> None:
    """States whose rings and compressor buffers are rows of shared tensors (the engine's
    slots) and whose entries live in shared pages give the same logits, through slot and
    page growth, release and reuse of a slot (whose rows and pages held another sequence),
    and cloning (``n`` > 1 samples)."""
    slots = StateSlots(
        lambda: model.new_state(1), max_slots=8, max_len=4096, initial_slots=2, initial_pages=1
    )
    _check_against_separate(
        model,
        lambda _: slots.new_state(),
        release=slots.release,
        clone=slots.clone,
        rounds=10,
    )
    assert slots.num_slots == 8 and slots.num_used == 7
    assert slots.page_table is not None and slots.page_table.num_pages > 1
    slots.new_state()
    with pytest.raises(RuntimeError, match="slots are in use"):
        slots.new_state()
    with pytest.raises(ValueError, match="layout differs"):
        StateSlots(lambda: model.new_state(1, slack=2), max_slots=2).clone(model.new_state(1))
    # Without max_len the entries stay per sequence (grown as they come).
    own = StateSlots(lambda: model.new_state(1), max_slots=8)
    _check_against_separate(
        model, lambda _: own.new_state(), release=own.release, clone=own.clone, rounds=10
    )


def test_states_made_together_are_fresh_and_their_own(model: DeepseekV4ForCausalLM) -> None:
    """``new_states(n)`` resets the rows of every slot it hands out at once (slots that held
    other sequences, and slots the pool grew for): each state equals one the model builds,
    in every slotted tensor and counter, its Python objects are its own, and its sequence then
    runs as it does in a state of its own tensors."""
    slots = StateSlots(
        lambda: model.new_state(1, slack=3), max_slots=8, max_len=4096, initial_slots=2
    )
    gen = torch.Generator().manual_seed(5)
    used = slots.new_states(3)
    model(ForwardBatch.build([text_ids(model, gen, 70) for _ in used], used))
    for state in used:
        slots.release(state)
    fresh = slots.new_states(5)  # three recycled slots, two the pool grows for
    reference = model.new_state(1, slack=3)
    for state in fresh:
        assert state.pos == 0 and state.slot > 0
        for f in slots.fields:
            got, want = getattr(f.owner(state), f.name), getattr(f.owner(reference), f.name)
            assert torch.equal(got, want), f
        for layer, ref in zip(state.layers, reference.layers, strict=True):
            assert layer.swa.length == ref.swa.length == 0
    first, second = fresh[0].layers[0], fresh[1].layers[0]
    assert first is not second and first.swa is not second.swa
    assert first.swa.marks is not second.swa.marks
    chunks = [text_ids(model, gen, n) for n in (1, 17, 40, 70, 129)]
    got = model(ForwardBatch.build(chunks, fresh)).logits
    want = torch.stack([model.step(c[None], model.new_state(1, slack=3))[0, -1] for c in chunks])
    assert float((want - got).abs().max()) < 5e-5
    # More states than the pool has room for: none is handed out, and the room stays.
    with pytest.raises(RuntimeError, match="slots are in use"):
        slots.new_states(slots.max_slots - slots.num_used + 1)
    assert len(slots.new_states(slots.max_slots - slots.num_used)) == 3


def _check_against_separate(
    model: DeepseekV4ForCausalLM,
    new_state: Callable[[int], ModelState],
    release: Callable[[ModelState], None] | None,
    clone: Callable[[ModelState], ModelState] | None,
    rounds: int,
) -> None:
    gen = torch.Generator().manual_seed(0)
    rnd = random.Random(0)
    n_seq = 7
    separate = [model.new_state(1) for _ in range(n_seq)]
    batched = [new_state(1) for _ in range(n_seq)]
    worst = 0.0
    for round_ in range(rounds):
        if release is not None and clone is not None and round_ in (2, 4):
            # Restart one sequence in a recycled slot, and fork another into a third.
            i, j, k = rnd.sample(range(n_seq), 3)
            release(batched[i])
            separate[i], batched[i] = model.new_state(1), new_state(1)
            release(batched[k])
            separate[k], batched[k] = clone_state(separate[j]), clone(batched[j])
        # A packed round over a random subset (sequences advance unevenly)...
        rows = sorted(rnd.sample(range(n_seq), rnd.randint(1, n_seq)))
        chunks = [text_ids(model, gen, rnd.choice(CHUNK_LENGTHS)) for _ in rows]
        want = torch.stack(
            [model.step(c[None], separate[i])[0, -1] for i, c in zip(rows, chunks, strict=True)]
        )
        got = model(ForwardBatch.build(chunks, [batched[i] for i in rows])).logits
        worst = max(worst, float((want - got).abs().max()))
        # ... then a few decode steps of another subset.
        for _ in range(rnd.randint(1, 9)):
            rows = sorted(rnd.sample(range(n_seq), rnd.randint(1, n_seq)))
            ids = text_ids(model, gen, len(rows))
            want = torch.stack(
                [model.step(ids[j].view(1, 1), separate[i])[0, 0] for j, i in enumerate(rows)]
            )
            got = model(ForwardBatch.decode(ids, [batched[i] for i in rows])).logits
            worst = max(worst, float((want - got).abs().max()))
    assert [s.pos for s in batched] == [s.pos for s in separate]
    longest = max(s.pos for s in batched)
    assert longest > model.cfg.sliding_window  # the rings wrapped
    assert longest // 4 > model.cfg.index_topk  # top-k picked among more entries than k
    assert worst < 5e-5, worst


def test_batched_forwards_reject_mismatched_inputs(model: DeepseekV4ForCausalLM) -> None:
    states = [model.new_state(1), model.new_state(1)]
    with pytest.raises(ValueError, match="input_ids must be"):
        model(ForwardBatch.decode(torch.tensor([5]), states))
    with pytest.raises(ValueError, match="2 states"):
        model(ForwardBatch.build([torch.tensor([5, 6])], states))
    with pytest.raises(ValueError, match="at least one token"):
        model(ForwardBatch.build([torch.tensor([5]), torch.tensor([], dtype=torch.long)], states))
    with pytest.raises(ValueError, match="batch of its own"):
        model(ForwardBatch.decode(torch.tensor([5, 6]), [model.new_state(2), model.new_state(1)]))


def _new_states(model: DeepseekV4ForCausalLM, layout: str) -> Callable[[], ModelState]:
    """States with their own tensors (run span by span), in the engine's slots with paged
    entries (the ragged pass), or in slots with their own entries (span by span)."""
    if layout == "own":
        return lambda: model.new_state(1)
    max_len = 4096 if layout == "slots" else None
    return StateSlots(lambda: model.new_state(1), max_slots=8, max_len=max_len).new_state


@pytest.fixture
def passes(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """How many multi-span steps ran as a ragged pass and how many span by span (each test
    checks the one it meant)."""
    from deepinfer.models import causal_lm

    counts = {"ragged": 0, "each": 0}
    ragged, each = causal_lm.run_ragged, DeepseekV4ForCausalLM._run_each

    def run_ragged(*args: Any) -> Any:
        counts["ragged"] += 1
        return ragged(*args)

    def run_each(self: DeepseekV4ForCausalLM, batch: ForwardBatch) -> Any:
        counts["each"] += len(batch.spans) > 1
        return each(self, batch)

    monkeypatch.setattr(causal_lm, "run_ragged", run_ragged)
    monkeypatch.setattr(DeepseekV4ForCausalLM, "_run_each", run_each)
    return counts


@pytest.mark.parametrize("start", ["fresh", "continuing"])
@pytest.mark.parametrize("layout", ["own", "slots", "slots_own_entries"])
def test_spans_at_one_position_equal_separate_forwards(
    model: DeepseekV4ForCausalLM,
    layout: str,
    start: str,
    passes: dict[str, int],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Sequences at one position with chunks of different lengths, beside a sequence at
    another position and a much longer chunk, run as one pass; the logits and every later
    decode step equal separate forwards. Fresh prompts start from empty states; continuing
    ones from states whose rings have wrapped and whose compressors have open windows (a
    suffix after a prefix-cache hit, the next piece of a chunked prompt). The indexers score
    spans of similar length as padded groups (forced on the CPU here)."""
    monkeypatch.setattr(ragged, "score_padding", lambda _: 0.5)
    gen = torch.Generator().manual_seed(5)
    new_state = _new_states(model, layout)
    n = 6
    separate = [model.new_state(1) for _ in range(n)]
    batched = [new_state() for _ in range(n)]
    warm = text_ids(model, gen, 9)  # sequence 0 is under way before the others start
    model.step(warm[None], separate[0])
    model(ForwardBatch.build([warm], batched[:1]))
    if start == "continuing":  # all but sequence 0 at one position, open windows everywhere
        for j in range(1, n):
            prefix = text_ids(model, gen, model.cfg.sliding_window + 7)
            model.step(prefix[None], separate[j])
            model(ForwardBatch.build([prefix], batched[j : j + 1]))
    length = model.cfg.sliding_window + 3  # the ring wraps inside the prompt
    sizes = [length - 13, length - 10, length, 60]
    chunks = [text_ids(model, gen, 5)] + [text_ids(model, gen, k) for k in sizes]
    chunks.append(text_ids(model, gen, 4 * length))
    want = torch.stack(
        [model.step(c[None], s)[0, -1] for c, s in zip(chunks, separate, strict=True)]
    )
    got = model(ForwardBatch.build(chunks, batched)).logits
    torch.testing.assert_close(got, want, rtol=0, atol=5e-5)
    assert [s.pos for s in batched] == [s.pos for s in separate]
    for _ in range(9):  # past the next CSA entries and the ring rows written by the prompt
        ids = text_ids(model, gen, n)
        want = torch.stack([model.step(ids[j].view(1, 1), s)[0, 0] for j, s in enumerate(separate)])
        got = model(ForwardBatch.decode(ids, batched)).logits
        torch.testing.assert_close(got, want, rtol=0, atol=5e-5)
    ragged_pass = layout == "slots"
    assert (passes["ragged"] > 0, passes["each"] > 0) == (ragged_pass, not ragged_pass)


@pytest.mark.parametrize("layout", ["own", "slots"])
def test_short_spans_inside_their_open_window(model: DeepseekV4ForCausalLM, layout: str) -> None:
    """Continuing spans so short that no compressor window closes in them, beside one that
    closes several: the open windows take their rows and the previous window's first half
    stays, so the decode steps after them equal separate forwards."""
    gen = torch.Generator().manual_seed(9)
    p0 = model.cfg.sliding_window + 9  # CSA (ratio 4): one row open; V4.1 (2): one row open
    new_state = _new_states(model, layout)
    separate = [model.new_state(1) for _ in range(3)]
    batched = [new_state() for _ in range(3)]
    for a, b in zip(separate, batched, strict=True):
        prefix = text_ids(model, gen, p0)
        model.step(prefix[None], a)
        model(ForwardBatch.build([prefix], [b]))
    chunks = [text_ids(model, gen, k) for k in (1, 2, 12)]
    want = torch.stack(
        [model.step(c[None], s)[0, -1] for c, s in zip(chunks, separate, strict=True)]
    )
    torch.testing.assert_close(
        model(ForwardBatch.build(chunks, batched)).logits, want, rtol=0, atol=5e-5
    )
    for _ in range(6):
        ids = text_ids(model, gen, 3)
        want = torch.stack([model.step(ids[j].view(1, 1), s)[0, 0] for j, s in enumerate(separate)])
        torch.testing.assert_close(
            model(ForwardBatch.decode(ids, batched)).logits, want, rtol=0, atol=5e-5
        )


def _assert_same_state(got: ModelState, want: ModelState) -> None:
    assert got.pos == want.pos
    for g, w in zip(got.layers, want.layers, strict=True):
        assert g.swa.length == w.swa.length
        torch.testing.assert_close(g.swa.kv, w.swa.kv, rtol=0, atol=5e-5)
        for part in ("compressor", "indexer"):
            gc, wc = getattr(g, part), getattr(w, part)
            assert (gc is None) == (wc is None)
            if gc is None:
                continue
            assert (gc.count, gc.fill) == (wc.count, wc.fill)
            for name in ("entries", "buf_kv", "buf_score", "prev_kv", "prev_score"):
                a, b = getattr(gc, name), getattr(wc, name)
                assert (a is None) == (b is None), name
                if a is not None:
                    torch.testing.assert_close(a, b, rtol=0, atol=5e-5, msg=name)
    if want.token_history is None:
        assert got.token_history is None
    else:
        assert torch.equal(got.token_history, want.token_history)


@pytest.mark.parametrize("layout", ["own", "slots"])
def test_states_at_marks_equal_states_of_cut_chunks(
    model: DeepseekV4ForCausalLM, layout: str
) -> None:
    """A step hands back each sequence's state at lengths inside its chunk (how the prefix
    cache records block boundaries without cutting the chunk): rings, open windows, previous
    half-windows, entries and Engram history equal those of a state whose chunk was cut
    there. The marks fall mid-window for every compressor ratio, before and after the ring
    wraps and on both sides of the first complete windows; a continuing sequence and a fresh
    one share the step."""
    gen = torch.Generator().manual_seed(11)
    w = model.cfg.sliding_window
    warm = text_ids(model, gen, 9)
    chunks = [text_ids(model, gen, 3 * w), text_ids(model, gen, 2 * w + 5)]
    starts = [9, 0]
    marks = [
        [s + 1, s + 6, s + w - 1, s + w + 3, s + c.numel() - 2]
        for s, c in zip(starts, chunks, strict=True)
    ]
    new_state = _new_states(model, layout)
    states = [new_state() for _ in chunks]
    cut = [model.new_state(1) for _ in chunks]
    for start, s, c in zip(starts, states, cut, strict=True):
        if start:
            model(ForwardBatch.build([warm], [s]))
            model.step(warm[None], c)
    out = model(ForwardBatch.build(chunks, states, record_at=marks))
    logits, views = out.logits, out.states_at
    for i, (chunk, start, state) in enumerate(zip(chunks, starts, cut, strict=True)):
        assert len(views[i]) == len(marks[i])
        done = start
        for length, view in zip(marks[i], views[i], strict=True):
            model.step(chunk[None, done - start : length - start], state)
            done = length
            _assert_same_state(view, state)
        last = model.step(chunk[None, done - start :], state)[0, -1]
        torch.testing.assert_close(logits[i], last, rtol=0, atol=5e-5)
        _assert_same_state(states[i], state)
    with pytest.raises(ValueError, match="not inside"):
        ForwardBatch.build([chunks[0]], [model.new_state(1)], record_at=[[0]])


def test_decode_batches_equal_the_checked_constructor(model: DeepseekV4ForCausalLM) -> None:
    """``ForwardBatch.decode`` writes its derived fields itself (it runs every step); they
    equal what the checked constructor derives, and what it refuses is still refused."""
    states = [model.new_state(1) for _ in range(5)]
    ids = torch.arange(5)
    fast = ForwardBatch.decode(ids, states)
    checked = ForwardBatch(ids, fast.spans)
    for name in ("spans", "image_embeds", "return_streams", "offsets", "num_tokens"):
        assert getattr(fast, name) == getattr(checked, name), name
    assert fast.decode_rows == checked.decode_rows and torch.equal(fast.input_ids, ids)
    assert fast.spans == tuple(SequenceSpan.new(s, 1) for s in states)
    with pytest.raises(ValueError, match="appears in two spans"):
        ForwardBatch.decode(torch.arange(2), [states[0], states[0]])


def test_streams_of_every_position_whatever_the_logits_kept(model: DeepseekV4ForCausalLM) -> None:
    """``return_streams`` hands back the final streams at every position of every span (an
    MTP drafter reads them all) while each span keeps only its last logits: the same from the
    ragged pass over slotted states as from span-by-span runs of states of their own."""
    gen = torch.Generator().manual_seed(4)
    chunks = [text_ids(model, gen, n) for n in (3, 17, 40)]
    streams = []
    for layout in ("own", "slots"):
        new_state = _new_states(model, layout)
        states = [new_state() for _ in chunks]
        out = model(ForwardBatch.build(chunks, states, return_streams=True))
        assert out.logits.shape[0] == len(chunks) and out.streams is not None
        streams.append(out.streams)
    assert streams[0].shape[0] == sum(c.numel() for c in chunks)
    torch.testing.assert_close(streams[1], streams[0], rtol=0, atol=5e-5)
