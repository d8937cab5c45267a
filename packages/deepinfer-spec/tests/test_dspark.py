"""The DSpark drafter, its decoding loop and its training objective.

* Greedy DSpark decoding emits exactly the target's greedy tokens (the tokens the target picks
  one at a time, recomputed from scratch), on the V4.1 tiny model with the shipped drafter and
  with an untrained one, and on a V4 model.
* A block sees only the context before its anchor and its own block: changing features at or
  after the anchor, or another block's tokens, leaves it unchanged; changing one before it does.
* Absorbing context position by position gives the drafts of absorbing it at once.
* The shipped drafter accepts drafts on held-out text; a drafter built for another target is
  refused.
* In the engine, DSpark keeps greedy outputs through chunked prefill, prefix-cache hits and
  preemption, with every draft verified, a confidence threshold, or the confidence schedule
  (which verifies all, some or none of the drafts as the step's cost table makes them worth).
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch

from deepinfer.assets import random_tiny_model, tiny_model, tiny_tokenizer
from deepinfer.cache.pools import state_bytes
from deepinfer.engine.config import EngineConfig
from deepinfer.engine.engine import LLMEngine
from deepinfer.engine.spec_config import SpeculativeConfig
from deepinfer.engine.verify_cost import power_points, profile_points
from deepinfer.engine.verify_profile import draft_counts
from deepinfer.errors import InvalidRequestError
from deepinfer.models.causal_lm import DeepseekCausalLM
from deepinfer.outputs import RequestOutput
from deepinfer.paging import PAGE_TOKENS
from deepinfer.sampling_params import SamplingParams
from deepinfer_spec.dspark import DSparkConfig, DSparkDrafter, dspark_generate
from deepinfer_spec.dspark.draft import DraftContext, propose
from deepinfer_spec.dspark.training import block_mask
from deepinfer_spec.dspark.weights import SHIPPED, load_drafter, save_drafter

PROMPT = [0, 1340, 18, 410, 612, 33, 907, 25, 11, 260, 1890, 47]


def _greedy(model: DeepseekCausalLM, prompt: list[int], n: int) -> list[int]:
    ids, out = list(prompt), []
    for _ in range(n):
        nxt = int(model.forward_logits(torch.tensor([ids]))[0, -1].argmax())
        out.append(nxt)
        ids.append(nxt)
    return out


@pytest.fixture(scope="module")
def tiny() -> DeepseekCausalLM:
    return tiny_model(torch.float32)


def _untrained(model: DeepseekCausalLM, seed: int = 0) -> DSparkDrafter:
    torch.manual_seed(seed)
    return DSparkDrafter(DSparkConfig.for_target(model.cfg)).eval()


@pytest.mark.parametrize("drafter", ["shipped", "untrained"])
def test_greedy_dspark_emits_the_targets_greedy_tokens(
    tiny: DeepseekCausalLM, drafter: str
) -> None:
    d = load_drafter(SHIPPED, tiny) if drafter == "shipped" else _untrained(tiny)
    got = dspark_generate(tiny, d, PROMPT, 40)
    assert got.tokens == _greedy(tiny, PROMPT, 40)
    assert all(0 <= n <= d.c.block_size for n in got.accepted)
    if drafter == "shipped":
        assert got.tau > 1.5  # trained drafts survive


def test_greedy_dspark_on_a_v4_model() -> None:
    model = random_tiny_model(torch.float32, seed=5)
    got = dspark_generate(model, _untrained(model), PROMPT, 12)
    assert got.tokens == _greedy(model, PROMPT, 12)


def test_sampled_dspark_is_reproducible(tiny: DeepseekCausalLM) -> None:
    d = load_drafter(SHIPPED, tiny)
    a = dspark_generate(tiny, d, PROMPT, 24, temperature=1.0, seed=7)
    b = dspark_generate(tiny, d, PROMPT, 24, temperature=1.0, seed=7)
    c = dspark_generate(tiny, d, PROMPT, 24, temperature=1.0, seed=8)
    assert a.tokens == b.tokens and a.tokens != c.tokens


def test_a_block_sees_only_context_before_its_anchor(tiny: DeepseekCausalLM) -> None:
    d = _untrained(tiny)
    c, seq = d.c, 24
    gen = torch.Generator().manual_seed(0)
    feats = torch.randn(1, seq, c.feature_size, generator=gen)
    tokens = torch.randint(3, 8000, (1, seq), generator=gen)
    anchors = torch.tensor([[4, 10]])
    positions = (anchors[:, :, None] + torch.arange(c.block_size)).flatten(1)

    def hidden(f: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        ctx = d.context(f, torch.arange(seq)[None])
        block = d.block_input(t.gather(1, anchors), tiny.embed).flatten(1, 2)
        mask = block_mask(anchors, seq, c.block_size)
        return d.backbone(block, positions, ctx, mask).view(2, c.block_size, -1)

    with torch.no_grad():
        base = hidden(feats, tokens)
        later = feats.clone()
        later[0, 10:] += 1.0  # at and after the second anchor
        moved = hidden(later, tokens)
        assert torch.equal(moved[0], base[0]) and torch.equal(moved[1], base[1])
        earlier = feats.clone()
        earlier[0, 9] += 1.0  # just before it
        assert torch.equal(hidden(earlier, tokens)[0], base[0])  # after the first's anchor
        assert not torch.allclose(hidden(earlier, tokens)[1], base[1])
        other = tokens.clone()
        other[0, 10] = (other[0, 10] + 1) % 8000  # the second block's anchor token
        assert torch.equal(hidden(feats, other)[0], base[0])


def test_context_absorbed_step_by_step_drafts_as_at_once(tiny: DeepseekCausalLM) -> None:
    d = _untrained(tiny, seed=1)
    feats = torch.randn(9, d.c.feature_size, generator=torch.Generator().manual_seed(2))
    whole, parts = DraftContext(), DraftContext()
    whole.absorb(d, feats)
    for chunk in feats.split([4, 1, 3, 1]):
        parts.absorb(d, chunk)
    a = propose(d, whole, 77, tiny.embed, tiny.logits)
    b = propose(d, parts, 77, tiny.embed, tiny.logits)
    assert torch.equal(a.tokens, b.tokens)
    torch.testing.assert_close(a.confidence, b.confidence, rtol=0, atol=1e-6)


def test_a_drafter_for_another_target_is_refused() -> None:
    model = random_tiny_model(torch.float32, seed=5)
    d = load_drafter(SHIPPED, tiny_model(torch.float32))
    assert d.c.hidden_size != model.cfg.hidden_size  # the V4 test model is narrower
    with pytest.raises(ValueError, match="DSpark drafter was built for"):
        dspark_generate(model, d, PROMPT, 4)


def _engine_outputs(
    model: DeepseekCausalLM,
    prompts: list[list[int]],
    spec: dict | None,
    params: SamplingParams | None = None,
    **options: int,
) -> tuple[list[RequestOutput], LLMEngine]:
    config = EngineConfig(**{"max_num_batched_tokens": 96, **options}, speculative_config=spec)
    engine = LLMEngine(model, tiny_tokenizer(), config)
    params = params or SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    ids = [engine.add_request(p, params) for p in prompts]
    done = engine.run()
    return [done[i] for i in ids], engine


def _engine_run(
    model: DeepseekCausalLM, prompts: list[list[int]], spec: dict | None, **options: int
) -> tuple[list[list[int]], LLMEngine]:
    outs, engine = _engine_outputs(model, prompts, spec, **options)
    return [o.outputs[0].token_ids for o in outs], engine


def _engine_prompts(n: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(n)
    prompts = [torch.randint(3, 8000, (int(torch.randint(5, 150, (1,), generator=gen)),),
                             generator=gen).tolist() for _ in range(n)]  # fmt: skip
    shared = prompts[0] * 3
    return [*prompts, *[[*shared[:140], 9, i] for i in range(3)]]  # prefix-cache hits


@pytest.mark.parametrize("drafter", ["shipped", "untrained"])
def test_engine_dspark_keeps_greedy_outputs(
    tiny: DeepseekCausalLM, drafter: str, tmp_path: Path
) -> None:
    """The engine with DSpark (5 drafts a round, chunked prefill at 96 tokens, prefix-cache
    hits) emits the engine's greedy tokens without speculation; the shipped drafter's drafts
    survive, an untrained one's, given as ``model``, hardly."""
    prompts = _engine_prompts(6)
    want, plain = _engine_run(tiny, prompts, None)
    spec = {"method": "dspark", "num_speculative_tokens": 5}
    if drafter == "untrained":
        save_drafter(_untrained(tiny), tmp_path)
        spec["model"] = str(tmp_path)
    got, engine = _engine_run(tiny, prompts, spec)
    assert got == want
    assert engine.spec is not None and engine.spec.num_drafts > 0
    rate = engine.spec.num_accepted / engine.spec.num_drafts
    if drafter == "shipped":  # random prompts: far fewer kept than on the plays (the card)
        assert rate > 0.1 and engine.num_steps < plain.num_steps
    else:
        assert rate < 0.02


def test_engine_dspark_with_preemption(tiny: DeepseekCausalLM) -> None:
    """A pool of three 128-token states preempts requests mid-decode: recomputed, their
    drafter contexts start again and the outputs still equal the engine's without it."""
    prompts = [p[:110] + [5] * max(0, 100 - len(p)) for p in _engine_prompts(5)[:5]]
    options = {"max_num_seqs": 8, "max_num_batched_tokens": 64}
    want, _ = _engine_run(tiny, prompts, None, **options)
    spec = {"method": "dspark", "num_speculative_tokens": 4}
    memory = 3 * state_bytes(tiny.cfg, tiny.dtype, PAGE_TOKENS)
    got, engine = _engine_run(tiny, prompts, spec, state_memory_bytes=memory, **options)
    assert got == want
    assert engine.pool.used_bytes == 0


def test_engine_dspark_confidence_threshold(tiny: DeepseekCausalLM) -> None:
    """The static threshold verifies drafts only up to the first whose confidence is below it:
    fewer drafts than verifying all, none at all with a threshold of 1 (no confidence reaches
    it), and the same greedy outputs either way."""
    prompts = _engine_prompts(4)
    want, _ = _engine_run(tiny, prompts, None)
    counts = []
    for threshold in (0.0, 0.3, 1.0):
        spec = {"method": "dspark", "num_speculative_tokens": 5,
                "confidence_threshold": threshold}  # fmt: skip
        got, engine = _engine_run(tiny, prompts, spec)
        assert got == want
        assert engine.spec is not None
        counts.append(engine.spec.num_drafts)
    assert counts[0] > counts[1] > counts[2] == 0
    with pytest.raises(InvalidRequestError, match="confidence_threshold"):
        SpeculativeConfig.parse({"method": "mtp", "num_speculative_tokens": 2,
                                 "confidence_threshold": 1.5})  # fmt: skip


def test_engine_dspark_seeded_sampling_equals_no_speculation(tiny: DeepseekCausalLM) -> None:
    """Seeded sampling at temperature 1 with top-p: every schedule (all drafts, the threshold,
    an adaptive plan that verifies some) emits the tokens the engine draws without speculation,
    since a draft is kept iff it equals the sampler's draw at its position."""
    prompts = _engine_prompts(3)
    params = SamplingParams(temperature=1.0, top_p=0.9, seed=11, max_tokens=24, ignore_eos=True)
    want, _ = _engine_outputs(tiny, prompts, None, params)
    fixed = {"method": "dspark", "num_speculative_tokens": 5}
    schedules = {
        "fixed": fixed,
        "threshold": {**fixed, "confidence_threshold": 0.3},
        "adaptive": {**fixed, "scheduling": "adaptive", "verify_cost": {1: 1.0, 2: 1.2}},
    }
    for name, spec in schedules.items():
        outs, engine = _engine_outputs(tiny, prompts, spec, params)
        assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in want]
        assert engine.spec is not None and engine.spec.num_accepted > 0, name


def test_engine_dspark_adaptive_scheduling(tiny: DeepseekCausalLM) -> None:
    """Confidence-scheduled verification keeps the greedy outputs whatever it verifies. With a
    flat cost table (extra tokens are free) it verifies every draft, as verifying all k does;
    when each token triples the step time no draft pays for itself (a draft adds at most one
    expected token to the at least one a row emits, and triples the step), so it does not
    draft at all after the prompt (plain steps); nor when a step of any verification row costs
    ten plain steps (a row emits at most six tokens); with a moderate slope, some. A drafting
    cost far above a step's turns drafting off too, even with free verification. Without
    tables it profiles the model and the drafter at start: plain and verification steps at the
    powers of two up to the CPU's cap of rows (the drafter at every midpoint too), never
    decreasing, no verification step below the plain step of its rows."""
    prompts = _engine_prompts(2)
    want, _ = _engine_run(tiny, prompts, None)
    fixed = {"method": "dspark", "num_speculative_tokens": 5}
    _, every = _engine_run(tiny, prompts, fixed)
    assert every.spec is not None
    tables = {
        "flat": {1: 1.0, 4096: 1.0},
        "moderate": {1: 1.0, 2: 1.2},
        "tripling": {n: 3.0**n for n in range(1, 201)},  # a step here holds at most 116 tokens
        "priced plain step": {1: 1.0, 4096: 1.0},
        "costly drafting": {1: 1.0, 4096: 1.0},
        "profiled": None,
    }
    drafts, skipped = {}, {}
    for name, table in tables.items():
        spec = {**fixed, "scheduling": "adaptive"}
        if table is not None:
            spec["verify_cost"] = table
        if name == "priced plain step":
            spec["plain_cost"] = {1: 0.1}
        if name == "costly drafting":
            spec["draft_cost"] = {"1": 100.0}
        outs, engine = _engine_outputs(tiny, prompts, spec)
        assert [o.outputs[0].token_ids for o in outs] == want, name
        assert engine.spec is not None and engine.spec.verifier is not None
        verifier, drafts[name] = engine.spec.verifier, engine.spec.num_drafts
        metrics = [o.metrics for o in outs if o.metrics is not None]
        assert verifier.offered == drafts[name] + sum(m.spec_trimmed_tokens for m in metrics)
        assert verifier.planned == drafts[name] == sum(m.spec_draft_tokens for m in metrics)
        assert verifier.mean_planned == (drafts[name] / verifier.rows if verifier.rows else 0)
        skipped[name] = verifier.skipped
    assert drafts["flat"] == every.spec.num_drafts
    assert 0 < drafts["moderate"] < every.spec.num_drafts
    assert drafts["tripling"] == drafts["costly drafting"] == drafts["priced plain step"] == 0
    assert skipped["flat"] == 0 and skipped["tripling"] > 0 and skipped["costly drafting"] > 0
    verifier = engine.spec.verifier
    rows = tuple(power_points(64))
    assert verifier.cost.rows == rows == verifier.cost.plain.tokens
    assert all(a <= b for a, b in itertools.pairwise(verifier.cost.plain.seconds))
    for r, curve in zip(rows, verifier.cost.verify, strict=True):
        assert curve.tokens == tuple(r + d for d in draft_counts(r, 5))
        assert all(a <= b for a, b in itertools.pairwise(curve.seconds))
        assert curve.seconds[0] >= verifier.cost.plain_seconds(r)
    assert verifier.draft_cost is not None
    assert verifier.draft_cost.tokens == tuple(profile_points(64))
    assert all(a <= b for a, b in itertools.pairwise(verifier.draft_cost.seconds))
