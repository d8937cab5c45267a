"""The adaptive schedule's prior for the shipped DSpark drafter: the acceptance per draft
position it reached on held-out plays when it was trained (``train_log.json``, written by
``tools/train_dspark.py`` from its own decoding loop), against what the engine's fixed-k
rounds keep on other held-out windows; and what the prior is for: at step costs under which a
round that keeps that much pays (a GPU's batch-1 ratios: a verification step 1.4 plain steps,
drafting 0.6), the schedule drafts from its first round, where the geometric guess (each draft
half as likely as the one before) says a round never pays and so never tests it."""

from __future__ import annotations

import itertools
import sys
from functools import cache
from pathlib import Path

import pytest

from deepinfer import LLM, SamplingParams
from deepinfer.assets import tiny_tokenizer
from deepinfer_spec import speculators
from deepinfer_spec.dspark.weights import load_acceptance

TOOLS = Path(__file__).resolve().parents[3] / "tools"
GREEDY = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
FIXED = {"method": "dspark", "num_speculative_tokens": 5}
#: Step costs by tokens (a row of 6 is the last token and 5 drafts), plain steps by rows, a
#: drafting round by requests: the batch-1 ratios measured on an H200.
PRICED = {
    **FIXED,
    "scheduling": "adaptive",
    "verify_cost": {1: 1.0, 6: 1.4},
    "plain_cost": {1: 1.0},
    "draft_cost": {1: 0.6},
}


@cache
def held_out(n: int, length: int) -> tuple[tuple[int, ...], ...]:
    """``n`` windows of ``length`` tokens spread over the held-out plays."""
    sys.path.insert(0, str(TOOLS))
    try:
        from tiny.corpus import load_corpus  # type: ignore[import-not-found]
        from tiny.data import spread_windows  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(TOOLS))
    ids = tiny_tokenizer().encode(load_corpus().validation_text).ids
    return tuple(tuple(w) for w in spread_windows(ids, n, length))


def _generate(llm: LLM, prompts: tuple[tuple[int, ...], ...]) -> list[list[int]]:
    outs = llm.generate([{"prompt_token_ids": list(p)} for p in prompts], GREEDY, use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs]


def test_the_shipped_prior_is_what_the_engine_keeps() -> None:
    """On the training evaluation's protocol (12 held-out windows of 32 tokens, 96 greedy
    tokens each; other windows of the same plays), the share of the engine's rounds that kept
    each position is within 0.06 of the training-time measurement (about 400 rounds), and the
    prior is a survival curve (non-increasing, in [0, 1])."""
    llm = LLM("tiny", device="cpu", max_num_seqs=4, speculative_config=FIXED)
    spec = llm.engine.spec
    assert spec is not None
    prior = spec.drafter.acceptance_prior  # type: ignore[attr-defined]
    assert prior is not None and set(prior) == {False, True}
    for curve in prior.values():
        assert all(1 >= a >= b >= 0 for a, b in itertools.pairwise(curve))
    params = SamplingParams(temperature=0.0, max_tokens=96, ignore_eos=True)
    prompts = [{"prompt_token_ids": list(p)} for p in held_out(12, 32)]
    metrics = [o.metrics for o in llm.generate(prompts, params, use_tqdm=False) if o.metrics]
    rounds = sum(m.spec_rounds for m in metrics)
    kept = [sum(m.spec_accepted_per_position[j] for m in metrics) / rounds for j in range(5)]
    assert rounds > 300
    assert all(abs(k - p) <= 0.06 for k, p in zip(kept, prior[False], strict=True)), (kept, prior)


def test_the_prior_lets_a_paying_schedule_draft(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the drafter's prior the schedule drafts and keeps drafts from the start, and emits
    the tokens of the engine without speculation; with the geometric guess instead it never
    drafts at the same costs."""
    prompts = held_out(2, 64)
    want = _generate(LLM("tiny", device="cpu", speculative_config=None), prompts)
    llm = LLM("tiny", device="cpu", max_num_seqs=1, speculative_config=PRICED)
    assert _generate(llm, prompts) == want
    spec = llm.engine.spec
    assert spec is not None and spec.num_drafts > 0 and spec.num_accepted > 0
    monkeypatch.setattr(speculators, "load_acceptance", lambda _path: None)
    guessed = LLM("tiny", device="cpu", max_num_seqs=1, speculative_config=PRICED)
    assert _generate(guessed, prompts) == want
    assert guessed.engine.spec is not None and guessed.engine.spec.num_drafts == 0


@pytest.mark.parametrize(
    "text",
    ["not json", "[1, 2]", '{"eval": 3}', '{"eval": {"greedy": 1}}',
     '{"eval": {"greedy": {"accept_rate_at_k": [0.5, 1.5]}}}'],
)  # fmt: skip
def test_a_train_log_without_a_usable_evaluation_gives_no_prior(tmp_path: Path, text: str) -> None:
    """A drafter directory's log that does not hold acceptance rates in [0, 1] (or none at
    all) leaves the schedule on its guess rather than failing the engine."""
    assert load_acceptance(tmp_path) is None
    (tmp_path / "train_log.json").write_text(text)
    assert load_acceptance(tmp_path) is None
