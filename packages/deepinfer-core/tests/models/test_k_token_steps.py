"""Steps that mix every kind of row give the token-by-token reference's logits.

Speculative verification feeds k drafted tokens per request and needs the logits at every one of
them, in the same step as other requests' prefill chunks and single-token decode rows. Each step
here is one ``model(ForwardBatch)`` over such a mix, in a shuffled order: fresh prompts, chunks
that continue a sequence, 1-token rows, and rows of 2-6 tokens that keep every position's
logits. The reference runs each sequence one token at a time with a state of its own, so every
kept logit is checked against an independent path (the single-token step is itself checked
against transformers for V4 and a float64 re-implementation for V4.1 in the other model tests).
The sequences run past the sliding window and through every compressor phase, with states of
their own and as rows of the engine's shared slot tensors and entry pages.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest
import torch
from _tiny_models import text_ids

from deepinfer.assets import TINY_DIR, random_tiny_model, tiny_model
from deepinfer.cache.slots import StateSlots
from deepinfer.models import causal_lm
from deepinfer.models.batch import ForwardBatch, SequenceSpan
from deepinfer.models.causal_lm import DeepseekCausalLM
from deepinfer.models.graphs import DecodeGraphs
from deepinfer.models.state import ModelState

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
SEQUENCES = 6
ROUNDS = 9


def _backend(device: str, kind: str):  # type: ignore[no-untyped-def]
    if kind == "torch":
        return None
    sm100 = pytest.importorskip("deepinfer_kernels_sm100.backend")
    return sm100.Sm100Backend(torch.device(device))


def _model(name: str, device: str, kind: str) -> DeepseekCausalLM:
    backend = _backend(device, kind)
    if name == "v4":
        model = random_tiny_model(torch.float32, device=device, seed=5)
        if backend is not None:
            model.ops = backend
        return model
    if not (TINY_DIR / "model.safetensors").is_file():
        pytest.skip("the embedded V4.1 tiny model is not in this checkout")
    return tiny_model(torch.float32, device=device, backend=backend)


CASES = [(d, k) for d in DEVICES for k in (("torch", "sm100") if d == "cuda" else ("torch",))]


@pytest.fixture(scope="module", params=["v4", "v41"])
def name(request: pytest.FixtureRequest) -> str:
    return request.param


def _spans_for_round(
    rnd: random.Random, model: DeepseekCausalLM, gen: torch.Generator, first: bool
) -> list[tuple[int, torch.Tensor, int]]:
    """(sequence, ids, logits kept) for each sequence this round: a prompt chunk, a decode
    row, a k-token verification row or a continuing chunk (some sequences sit a round out)."""
    out = []
    for seq in range(SEQUENCES):
        kind = "prompt" if first else rnd.choice(["decode", "decode", "k", "k", "chunk", "idle"])
        if kind == "idle":
            continue
        n = {
            "prompt": rnd.randint(40, 150),
            "decode": 1,
            "k": rnd.randint(2, 6),
            "chunk": rnd.randint(7, 40),
        }[kind]
        keep = n if kind in ("k", "decode") or rnd.random() < 0.3 else 1
        out.append((seq, text_ids(model, gen, n), keep))
    rnd.shuffle(out)
    return out


@pytest.mark.parametrize("layout", ["own", "slots"])
@pytest.mark.parametrize(("device", "backend"), CASES)
def test_mixed_k_token_steps_equal_token_by_token(
    name: str, device: str, backend: str, layout: str
) -> None:
    model = _model(name, device, backend)
    new_state: Callable[[], ModelState] = lambda: model.new_state(1)  # noqa: E731
    if layout == "slots":
        new_state = StateSlots(new_state, max_slots=SEQUENCES, max_len=1024).new_state
    states = [new_state() for _ in range(SEQUENCES)]
    reference = [model.new_state(1) for _ in range(SEQUENCES)]
    rnd, gen = random.Random(7), torch.Generator().manual_seed(7)
    tol = 5e-5 if device == "cpu" else 2e-4
    kinds: set[tuple[int, int]] = set()
    for step in range(ROUNDS):
        plan = _spans_for_round(rnd, model, gen, first=step == 0)
        ids = [chunk.to(device) for _, chunk, _ in plan]
        batch = ForwardBatch.build(ids, [states[s] for s, _, _ in plan], [k for *_, k in plan])
        got = model(batch).split(batch)
        for (seq, chunk, keep), logits in zip(plan, got, strict=True):
            want = torch.stack(
                [model.step(t.view(1, 1).to(device), reference[seq])[0, 0] for t in chunk]
            )[chunk.numel() - keep :]
            torch.testing.assert_close(logits, want, rtol=0, atol=tol, msg=f"step {step}")
            kinds.add((min(chunk.numel(), 7), keep))
    assert [s.pos for s in states] == [s.pos for s in reference]
    assert max(s.pos for s in states) > model.cfg.sliding_window  # the rings wrapped
    assert {(1, 1)} < kinds and any(1 < n <= 6 and k == n for n, k in kinds)


def test_a_batch_runs_once(name: str) -> None:
    """A batch whose states moved since it was built is refused, not run on stale positions."""
    model = _model(name, "cpu", "torch")
    state = model.new_state(1)
    batch = ForwardBatch.build([torch.tensor([5, 6, 7])], [state])
    model(batch)
    with pytest.raises(ValueError, match="runs once"):
        model(batch)
    with pytest.raises(ValueError, match="appears in two spans"):
        ForwardBatch(
            torch.tensor([5, 6]), (SequenceSpan.decode_row(state), SequenceSpan.decode_row(state))
        )


@pytest.mark.parametrize(
    ("graphs", "ahead"),
    [(False, False), (True, False), (True, True)],
    ids=["eager", "graphs", "graphs-device-drafts"],
)
@pytest.mark.parametrize(("device", "backend"), CASES)
def test_batched_verification_rows_roll_back_exactly(  # noqa: PLR0917
    name: str,
    device: str,
    backend: str,
    graphs: bool,
    ahead: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Several sequences in the engine's slots, built with rollback slack, verify drafts of
    1-6 tokens in one step (some steps all single-token rows, the decode pass; the others the
    verification pass, rows padded to the longest or, with graphs, to slack + 1 and captured
    on a GPU), keep a prefix of each and roll them all back in one call. Every kept logit
    equals a from-scratch forward over that sequence's accepted tokens, so the rings, open
    windows and history rings the shared passes wrote by index are exactly what a rollback
    needs. ``ahead``: the drafts after each row's first token come as a device tensor (more
    random ids past each row's length), the batch's ids there zeros, as the engine verifies
    drafts it has not read yet."""
    model = _model(name, device, backend)
    slots = StateSlots(lambda: model.new_state(1, slack=6), max_slots=3, max_len=1024)
    states = [slots.new_state() for _ in range(3)]
    step_graphs = DecodeGraphs(max_batch=4) if graphs else None
    widths: list[int] = []
    verify = causal_lm.run_verify

    def spy(*args: Any) -> Any:
        out = verify(*args)
        widths.append(args[4] or max(len(c) for c in args[1]))  # the pass's row width
        return out

    monkeypatch.setattr(causal_lm, "run_verify", spy)
    rnd, gen = random.Random(11), torch.Generator().manual_seed(11)
    accepted: list[list[int]] = [[] for _ in states]
    tol = 5e-5 if device == "cpu" else 2e-4
    decode_steps = 0
    while min(len(a) for a in accepted) <= model.cfg.sliding_window:  # the rings wrapped
        single = rnd.random() < 0.3
        drafts = [text_ids(model, gen, 1 if single else rnd.randint(1, 6)) for _ in states]
        decode_steps += single
        chunks, ahead_drafts = [d.to(device) for d in drafts], None
        if ahead:
            ahead_drafts = text_ids(model, gen, 6 * len(states)).view(len(states), 6)
            for row, d in zip(ahead_drafts, drafts, strict=True):
                row[: d.numel() - 1] = d[1:]
            ahead_drafts = ahead_drafts.to(device)
            chunks = [torch.cat((c[:1], torch.zeros_like(c[1:]))) for c in chunks]
        batch = ForwardBatch.build(chunks, states, [d.numel() for d in drafts])
        got = model(batch, step_graphs, drafts=ahead_drafts).split(batch)
        keeps = [rnd.randint(1, draft.numel()) for draft in drafts]
        for i, (draft, keep) in enumerate(zip(drafts, keeps, strict=True)):
            accepted[i] += draft[:keep].tolist()
        # every row at once, as the engine rolls back a step's rows
        model.rollback_many([(s, len(a), a) for s, a in zip(states, accepted, strict=True)])
        for logits, keep, ids in zip(got, keeps, accepted, strict=True):
            want = model.forward_logits(torch.tensor([ids], device=device))[0, -keep:]
            torch.testing.assert_close(logits[:keep], want, rtol=0, atol=tol)
    assert decode_steps > 0 and [s.pos for s in states] == [len(a) for a in accepted]
    assert widths and set(widths) == ({7} if graphs else set(range(2, 7)))


@pytest.mark.parametrize("layout", ["own", "slots"])
def test_verification_rows_roll_back_exactly(name: str, layout: str) -> None:
    """Speculative decoding's loop on one sequence: feed k = 6 drafted tokens as one row that
    keeps every logit, keep a prefix of them, roll the state back to it. Rounds cycle through
    every rejection position (keep 1 .. k: the first draft rejected, ..., none), at offsets
    that drift across the compressors' windows and the SWA ring's wrap. The kept logits
    equal a from-scratch forward over the accepted tokens, with the state's rings and buffers
    in shared slot tensors and entry pages too."""
    model = _model(name, "cpu", "torch")
    k = 6
    new_state: Callable[[], ModelState] = lambda: model.new_state(1, slack=k)  # noqa: E731
    if layout == "slots":
        new_state = StateSlots(new_state, max_slots=2, max_len=1024).new_state
    state = new_state()
    gen = torch.Generator().manual_seed(3)
    accepted: list[int] = []
    kept_counts = []
    while len(accepted) <= model.cfg.sliding_window + k:  # until the ring has wrapped
        draft = text_ids(model, gen, k)
        got = model(ForwardBatch.build([draft], [state], num_logits=[k])).logits
        keep = len(kept_counts) % k + 1
        kept_counts.append(keep)
        accepted += draft[:keep].tolist()
        model.rollback(state, len(accepted), accepted)
        want = model.forward_logits(torch.tensor([accepted]))[0, -keep:]
        torch.testing.assert_close(got[:keep], want, rtol=0, atol=5e-5)
    assert state.pos == len(accepted)
    assert kept_counts.count(1) >= 4 and set(kept_counts) == set(range(1, k + 1))


def test_device_drafts_feed_a_pass_other_than_verification(name: str) -> None:
    """States with tensors of their own take no verification pass: drafts given as a device
    tensor (the batch's ids there placeholders) are written into the batch's ids on the host,
    and each row's logits equal a from-scratch forward over its real tokens."""
    model = _model(name, "cpu", "torch")
    gen = torch.Generator().manual_seed(3)
    prompts = [text_ids(model, gen, n) for n in (9, 14)]
    states = [model.new_state(1) for _ in prompts]
    for state, prompt in zip(states, prompts, strict=True):
        model.step(prompt.view(1, -1), state)
    rows = [text_ids(model, gen, n) for n in (4, 2)]
    drafts = text_ids(model, gen, 2 * 5).view(2, 5)  # random past each row's length
    for draft, row in zip(drafts, rows, strict=True):
        draft[: row.numel() - 1] = row[1:]
    chunks = [torch.cat((r[:1], torch.zeros_like(r[1:]))) for r in rows]
    batch = ForwardBatch.build(chunks, states, [r.numel() for r in rows])
    got = model(batch, drafts=drafts).split(batch)
    for logits, prompt, row in zip(got, prompts, rows, strict=True):
        want = model.forward_logits(torch.cat((prompt, row))[None])[0, -row.numel() :]
        torch.testing.assert_close(logits, want, rtol=0, atol=5e-5)
