"""The engine with speculative decoding: greedy outputs equal the engine without it, and
sampled outputs follow the target's distribution.

Two drafters: the tiny model's own MTP layer (random weights: it proposes, the target rejects,
so this checks the flow end to end), and a drafter that knows the greedy continuations and
proposes them with every third round's second draft corrupted, so rows keep all, some or none
of their drafts. Either way every emitted token must be the target's own greedy choice, through
chunked prefill, prefix-cache hits and rollbacks. Seeded sampling gives a request the tokens
the engine draws without speculation, alone and in a batch.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import random
from pathlib import Path

import pytest
import torch
from _spec_drafters import KnowingDrafter
from torch import Tensor

from deepinfer.assets import random_tiny_model, tiny_tokenizer
from deepinfer.cache.pools import state_bytes
from deepinfer.cli import main
from deepinfer.engine import spec_setup
from deepinfer.engine import speculative as speculative_module
from deepinfer.engine.config import EngineConfig
from deepinfer.engine.engine import LLMEngine
from deepinfer.errors import InvalidRequestError
from deepinfer.models.causal_lm import DeepseekCausalLM
from deepinfer.outputs import RequestOutput
from deepinfer.paging import PAGE_TOKENS
from deepinfer.sampling_params import SamplingParams

K = 3
GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
SPEC = {"method": "mtp", "num_speculative_tokens": K}


@pytest.fixture(scope="module")
def model() -> DeepseekCausalLM:
    return random_tiny_model(torch.float32, seed=5)


def _prompts(n: int, seed: int) -> list[list[int]]:
    rnd = random.Random(seed)
    return [[rnd.randrange(3, 8000) for _ in range(rnd.randint(5, 200))] for _ in range(n)]


def _run(
    model: DeepseekCausalLM, prompts: list[list[int]], params: SamplingParams, spec: bool
) -> tuple[list[list[int]], LLMEngine, list[RequestOutput]]:
    config = EngineConfig(
        max_num_batched_tokens=96,
        speculative_config=SPEC if spec else None,
    )
    engine = LLMEngine(model, tiny_tokenizer(), config)
    ids = [engine.add_request(p, params) for p in prompts]
    out = engine.run()
    return [out[i].outputs[0].token_ids for i in ids], engine, [out[i] for i in ids]


def test_mtp_speculation_keeps_greedy_outputs(model: DeepseekCausalLM) -> None:
    prompts = _prompts(5, 0)
    prompts += [[*p[:150], 11, 12] for p in prompts if len(p) > 140]  # prefix-cache hits
    want, _, _ = _run(model, prompts, GREEDY, spec=False)
    got, engine, _ = _run(model, prompts, GREEDY, spec=True)
    assert got == want
    assert engine.spec is not None and engine.spec.num_drafts > 0


@pytest.mark.parametrize("batch", [1, 6, 64])
def test_accepted_drafts_keep_greedy_outputs(
    model: DeepseekCausalLM, batch: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batches of 1 to 64 sequences (chunked prefill at 96 tokens a step; the larger batches
    share prefixes, so some prefills hit the prefix cache)."""
    prompts = _prompts(batch, 1)
    if batch > 6:
        prompts = [p[:40] for p in prompts]
        shared = _prompts(1, 7)[0] * 2
        prompts[-8:] = [[*shared[:140], *p[:9]] for p in prompts[-8:]]  # prefix-cache hits
    want, plain, _ = _run(model, prompts, GREEDY, spec=False)
    drafter = KnowingDrafter([p + w for p, w in zip(prompts, want, strict=True)])
    monkeypatch.setattr(spec_setup, "load_drafter", lambda *_: drafter)
    got, engine, outs = _run(model, prompts, GREEDY, spec=True)
    assert got == want
    if batch > 6:
        assert sum(o.metrics.num_cached_tokens > 0 for o in outs if o.metrics) > 0
    spec = engine.spec
    assert spec is not None and 0 < spec.num_accepted < spec.num_drafts
    assert engine.num_steps < plain.num_steps  # several tokens a step
    metrics = [o.metrics for o in outs if o.metrics is not None]
    assert sum(m.spec_accepted_tokens for m in metrics) == spec.num_accepted
    assert sum(m.spec_draft_tokens for m in metrics) == spec.num_drafts
    for m in metrics:  # kept drafts are a prefix: each position at most as often as the one before
        per = m.spec_accepted_per_position
        assert len(per) == K and sum(per) == m.spec_accepted_tokens
        assert all(a >= b for a, b in itertools.pairwise(per))
        assert m.spec_acceptance_length == (m.spec_accepted_tokens + m.spec_rounds) / m.spec_rounds


def test_seeded_sampling_equals_the_engine_without_speculation(
    model: DeepseekCausalLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A draft is kept iff it equals the sampler's draw at its position, so a seeded request
    emits the tokens the engine without speculation draws, alone and in a batch, whichever
    drafts were kept (the drafter knows the seeded continuations, one draft in three rounds
    corrupted)."""
    prompts = _prompts(4, 2)
    params = SamplingParams(temperature=1.0, top_p=0.9, seed=3, max_tokens=16, ignore_eos=True)
    plain, _, _ = _run(model, prompts, params, spec=False)
    drafter = KnowingDrafter([p + o for p, o in zip(prompts, plain, strict=True)])
    monkeypatch.setattr(spec_setup, "load_drafter", lambda *_: drafter)
    batched, engine, _ = _run(model, prompts, params, spec=True)
    alone, _, _ = _run(model, prompts[1:2], params, spec=True)
    assert batched == plain and alone[0] == plain[1]
    assert engine.spec is not None and 0 < engine.spec.num_accepted < engine.spec.num_drafts


def test_prompt_logprobs_under_speculation_match_the_full_forward(
    model: DeepseekCausalLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request asking for prompt logprobs gets them (its prompt's chunks run as plain steps,
    every logit kept), each equal to a log-softmax of the whole sequence's forward, while it
    and the requests beside it keep drafting afterwards and keep their greedy outputs."""
    prompts = _prompts(3, 4)
    want, _, _ = _run(model, prompts, GREEDY, spec=False)
    drafter = KnowingDrafter([p + w for p, w in zip(prompts, want, strict=True)])
    monkeypatch.setattr(spec_setup, "load_drafter", lambda *_: drafter)
    engine = LLMEngine(
        model, tiny_tokenizer(), EngineConfig(max_num_batched_tokens=96, speculative_config=SPEC)
    )
    asking = dataclasses.replace(GREEDY, prompt_logprobs=2)
    ids = [engine.add_request(p, asking if i == 1 else GREEDY) for i, p in enumerate(prompts)]
    out = engine.run()
    assert [out[i].outputs[0].token_ids for i in ids] == want
    assert engine.spec is not None and engine.spec.num_accepted > 0
    got, prompt = out[ids[1]].prompt_logprobs, prompts[1]
    assert got is not None and got[0] is None and len(got) == len(prompt)
    ref = torch.log_softmax(model.forward_logits(torch.tensor([prompt]))[0].double(), dim=-1)
    for pos in range(1, len(prompt)):
        entry = got[pos]
        assert entry is not None
        top = torch.argsort(-ref[pos - 1], stable=True)[:2].tolist()
        assert set(entry) == {prompt[pos], *top}
        assert entry[prompt[pos]] == pytest.approx(float(ref[pos - 1, prompt[pos]]), abs=1e-4)
    assert out[ids[0]].prompt_logprobs is None


def test_unsupported_options_are_refused(model: DeepseekCausalLM) -> None:
    bad = [{"method": "mtp"}, {"method": "mtp", "num_speculative_tokens": 0}, "mtp"]
    for config in bad:
        with pytest.raises(InvalidRequestError, match="speculative_config"):
            LLMEngine(model, tiny_tokenizer(), EngineConfig(speculative_config=config))  # type: ignore[arg-type]
    dspark = {"method": "dspark", "num_speculative_tokens": 5}
    with pytest.raises(InvalidRequestError, match="DSpark"):
        LLMEngine(model, tiny_tokenizer(), EngineConfig(speculative_config=dspark))


def test_adaptive_scheduling_needs_a_drafter_with_confidences(
    model: DeepseekCausalLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A drafter that only drafts has no confidences to plan with: adaptive scheduling is
    refused by name before any profiling, in either spelling."""
    monkeypatch.setattr(spec_setup, "load_drafter", lambda *_: KnowingDrafter([]))
    for key, value in (("scheduling", "adaptive"), ("enable_adaptive_verification", True)):
        config = EngineConfig(speculative_config={**SPEC, key: value})
        with pytest.raises(InvalidRequestError, match="KnowingDrafter gives none"):
            LLMEngine(model, tiny_tokenizer(), config)


def test_draft_and_verify_times_count_each_pass(
    model: DeepseekCausalLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a clock that advances one second per reading, every verification step, every
    drafting pass's launch and every read of its drafts before a step lasts exactly a second
    (a step of verification rows alone reads its drafts with its pass, in the pass's time):
    a request's verification time is its rounds, its drafting time one or two seconds a
    round, or one more (the pass launched after its last tokens, never read), and the
    engine's totals count each launch and read once (so at most the requests' sums)."""
    ticks = itertools.count()
    monkeypatch.setattr(speculative_module, "perf_counter", lambda: float(next(ticks)))
    _, engine, outs = _run(model, _prompts(4, 7), GREEDY, spec=True)
    runner = engine.spec
    assert runner is not None and runner.verify_seconds > 0
    metrics = [o.metrics for o in outs if o.metrics is not None]
    for m in metrics:
        assert m.spec_verify_time == m.spec_rounds
        assert m.spec_rounds <= m.spec_draft_time <= 2 * m.spec_rounds + 1
    assert runner.verify_seconds <= sum(m.spec_verify_time for m in metrics)
    assert runner.draft_seconds <= sum(m.spec_draft_time for m in metrics)
    assert runner.verify_seconds >= max(m.spec_verify_time for m in metrics)


def test_bench_reports_the_acceptance(
    model: DeepseekCausalLM, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``deepinfer bench --speculative-method mtp`` on a V4 model (dummy weights from a
    config.json) and on the V4.1 tiny model (its trained MTP layer) reports tau, the
    acceptance per draft position and the seconds spent drafting and verifying (some, and
    less than the run)."""
    raw = {f.name: getattr(model.cfg, f.name) for f in dataclasses.fields(model.cfg) if f.init}
    raw = {k: v for k, v in raw.items() if v is not None}
    raw.update(model_type="deepseek_v4", vocab_size=129280)  # the dummy tokenizer's size
    (tmp_path / "config.json").write_text(json.dumps(raw, default=list))
    out = tmp_path / "bench.json"
    common = ["bench", "--device", "cpu", "--num-seqs", "2", "--max-input-len", "32"]
    common += ["--max-output-len", "16", "--speculative-method", "mtp"]
    argv = [*common, "--model", str(tmp_path), "--load-format", "dummy", "--json", str(out)]
    for run in (argv, [*common, "--model", "tiny", "--json", str(out)]):
        assert main(run) == 0
        result = json.loads(out.read_text())
        assert result["spec_acceptance_length"] >= 1
        assert len(result["spec_acceptance_per_position"]) == 3
        spent = result["spec_draft_seconds"] + result["spec_verify_seconds"]
        assert result["spec_draft_seconds"] > 0 and result["spec_verify_seconds"] > 0
        assert spent < result["seconds"]
    assert result["spec_acceptance_length"] > 1.2  # the tiny model's trained layer keeps some


def test_bench_selects_the_verification_schedule(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--speculative-scheduling adaptive`` runs DSpark's confidence schedule (on the tiny
    model, its cost profiled at start) and reports the drafts verified a round, at most k
    (where the profile, timed on a busy machine, found any round worth verifying); the
    schedule without a drafter, or with a threshold, fails with one line naming it."""
    out = tmp_path / "bench.json"
    common = ["bench", "--model", "tiny", "--device", "cpu", "--num-seqs", "2",
              "--max-num-seqs", "2", "--max-input-len", "32", "--max-output-len", "16"]  # fmt: skip
    spec = ["--speculative-method", "dspark", "--num-speculative-tokens", "5"]
    adaptive = ["--speculative-scheduling", "adaptive"]
    assert main([*common, *spec, *adaptive, "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    if result["spec_rounds"]:
        assert 0 <= result["spec_verified_per_round"] <= 5
        assert result["spec_acceptance_length"] >= 1
    capsys.readouterr()
    for argv, names in (
        ([*common, *adaptive], "--speculative-scheduling"),
        ([*common, *spec, *adaptive, "--confidence-threshold", "0.3"], "confidence_threshold"),
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error:") and names in err[0]


@pytest.mark.parametrize("drafter", ["mtp", "knowing"])
def test_preemption_keeps_greedy_outputs(
    model: DeepseekCausalLM, drafter: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pool that holds three 128-token states preempts sequences as they cross into their
    second page, drafts and pending positions included: after recomputation the outputs
    still equal the engine's without speculation, and every byte comes back."""
    rnd = random.Random(1)
    prompts = [[rnd.randrange(3, 8000) for _ in range(rnd.randint(100, 120))] for _ in range(5)]
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    base = LLMEngine(
        model, tiny_tokenizer(), EngineConfig(max_num_seqs=8, max_num_batched_tokens=64)
    )
    ids = [base.add_request(p, params) for p in prompts]
    done = base.run()
    want = [done[i].outputs[0].token_ids for i in ids]
    if drafter == "knowing":
        knowing = KnowingDrafter([p + w for p, w in zip(prompts, want, strict=True)])
        monkeypatch.setattr(spec_setup, "load_drafter", lambda *_: knowing)
    config = EngineConfig(
        max_num_seqs=8,
        max_num_batched_tokens=64,
        speculative_config=SPEC,
        state_memory_bytes=3 * state_bytes(model.cfg, model.dtype, PAGE_TOKENS),
    )
    engine = LLMEngine(model, tiny_tokenizer(), config)
    ids = [engine.add_request(p, params) for p in prompts]
    done = engine.run()
    assert [done[i].outputs[0].token_ids for i in ids] == want
    assert sum(o.metrics.num_preemptions for o in done.values() if o.metrics) > 0
    assert engine.pool.used_bytes == 0


def _filtered(logits: Tensor, top_k: int, top_p: float) -> Tensor:
    """The sampler's distribution at temperature 1, recomputed in float64 from its documented
    semantics: the k most likely tokens, then the shortest most-likely prefix of their
    renormalised mass that reaches top_p."""
    p = torch.softmax(logits.double(), dim=-1)
    kept = torch.sort(-p, stable=True).indices[:top_k]
    q = p[kept] / p[kept].sum()
    kept = kept[(torch.cumsum(q, 0) - q) < top_p]
    out = torch.zeros_like(p)
    out[kept] = p[kept] / p[kept].sum()
    return out


def _chi_square_p(counts: Tensor, want: Tensor) -> float:
    """p-value of Pearson's chi-square test of ``counts`` against the distribution ``want``
    (bins expecting fewer than 5 draws are pooled with the smallest of the rest); no draw may
    fall outside the distribution's support."""
    assert int(counts[want == 0].sum()) == 0, "a token the filters remove was drawn"
    n = float(counts.sum())
    expected = want * n
    order = torch.argsort(expected)
    obs, exp = counts.double()[order], expected[order]
    small = exp < 5
    obs = torch.cat((obs[small].sum().view(1), obs[~small]))
    exp = torch.cat((exp[small].sum().view(1), exp[~small]))
    if exp[0] < 5:  # too little to stand alone: fold into the next bin
        obs, exp = (
            torch.cat((obs[:2].sum().view(1), obs[2:])),
            torch.cat((exp[:2].sum().view(1), exp[2:])),
        )
    stat = float(((obs - exp) ** 2 / exp).sum())
    dof = exp.numel() - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2), torch.tensor(stat / 2)))


def test_speculative_sampling_keeps_the_target_distribution(
    model: DeepseekCausalLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Many seeded requests of one prompt at temperature 1 with top-k and top-p, verified
    against drafts of the target's greedy continuations (every third round's second draft
    corrupted): the second token, given the first, and the third, given the first two where
    the first draft was kept, are distributed as the target's filtered distribution,
    recomputed in float64 from its logits (Pearson's chi-square, p > 1e-3 per group)."""
    top_k, top_p, n = 4, 0.9, 1200
    prompt = _prompts(1, 9)[0][:12]

    def dist(tokens: list[int]) -> Tensor:
        return _filtered(model.forward_logits(torch.tensor([tokens]))[0, -1], top_k, top_p)

    first = dist(prompt)
    sequences = []
    for t1 in first.nonzero()[:, 0].tolist():
        seq = [*prompt, t1]
        for _ in range(K):
            seq.append(int(dist(seq).argmax()))
        sequences.append(seq)
    drafter = KnowingDrafter(sequences)
    monkeypatch.setattr(spec_setup, "load_drafter", lambda *_: drafter)
    engine = LLMEngine(
        model, tiny_tokenizer(), EngineConfig(max_num_seqs=256, speculative_config=SPEC)
    )
    ids = []
    for seed in range(n):
        params = SamplingParams(temperature=1.0, top_k=top_k, top_p=top_p, seed=seed,
                                max_tokens=3, ignore_eos=True)  # fmt: skip
        ids.append(engine.add_request(prompt, params))
    done = engine.run()
    outs = torch.tensor([done[i].outputs[0].token_ids for i in ids])
    assert engine.spec is not None and 0 < engine.spec.num_accepted < engine.spec.num_drafts
    vocab = model.cfg.vocab_size
    tested = 0
    for seq in sequences:
        t1, a2 = seq[len(prompt)], seq[len(prompt) + 1]
        rows = outs[:, 0] == t1
        if int(rows.sum()) >= 100:
            counts = torch.bincount(outs[rows, 1], minlength=vocab)
            assert _chi_square_p(counts, dist([*prompt, t1])) > 1e-3
            tested += 1
        rows &= outs[:, 1] == a2  # the first draft kept: the third token checks draft two
        if int(rows.sum()) >= 100:
            counts = torch.bincount(outs[rows, 2], minlength=vocab)
            assert _chi_square_p(counts, dist([*prompt, t1, a2])) > 1e-3
            tested += 1
    assert tested >= 3
