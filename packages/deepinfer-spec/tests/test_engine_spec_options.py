"""Every sampling option under speculative decoding, checked against the engine without it.

Greedy requests with penalties, logit bias, bad words, allowed tokens, ``min_tokens``, stop
tokens, structured outputs and ``n`` > 1 emit exactly the tokens (and logprobs, within float
rounding) of the engine without speculation, with three drafters: one that knows the
continuations (the option's own and the unconstrained one, so drafts are kept, and rejected
where the option changes the target's choice), the tiny model's MTP layer (random weights:
mostly rejected) and the shipped DSpark drafter on the trained tiny model. Sampled structured
outputs validate with ``jsonschema``; sampled tokens with a logit bias and a presence penalty
follow the processed target distribution, recomputed here in float64 from the model's logits
(Pearson's chi-square).
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator, Sequence
from typing import Any

import jsonschema
import pytest
import torch
from _spec_drafters import KnowingDrafter
from tokenizers import Tokenizer
from torch import Tensor

from deepinfer.assets import random_tiny_model, tiny_model, tiny_tokenizer
from deepinfer.engine import engine as engine_module
from deepinfer.engine import spec_sampling, spec_setup
from deepinfer.engine.config import EngineConfig
from deepinfer.engine.engine import LLMEngine
from deepinfer.engine.request import Request
from deepinfer.models.causal_lm import DeepseekCausalLM
from deepinfer.outputs import CompletionOutput
from deepinfer.sampling_params import SamplingParams

K = 3
MTP = {"method": "mtp", "num_speculative_tokens": K}
DSPARK = {"method": "dspark", "num_speculative_tokens": 4}
EOS = 1
PRESENCE, TOP_K = 2.0, 4
#: Bounded strings, numbers and arrays keep a random-weight model's JSON short.
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "mood": {"enum": ["happy", "sad", "wroth"]},
        "tags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3},
    },
    "required": ["name", "age", "mood"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module", autouse=True)
def _one_thread() -> Iterator[None]:
    """Tiny models gain nothing from intra-op threads, and lose much on a busy machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def v4() -> DeepseekCausalLM:
    return random_tiny_model(torch.float32, seed=5)


@pytest.fixture(scope="module")
def v41() -> DeepseekCausalLM:
    return tiny_model(torch.float32)


def _prompts(n: int, seed: int, longest: int = 40) -> list[list[int]]:
    rnd = random.Random(seed)
    return [[rnd.randrange(3, 8000) for _ in range(rnd.randint(5, longest))] for _ in range(n)]


def _generate(
    model: DeepseekCausalLM,
    prompts: Sequence[list[int]],
    params: Sequence[SamplingParams],
    spec: dict[str, object] | None,
    drafter: KnowingDrafter | None = None,
) -> tuple[list[list[CompletionOutput]], LLMEngine]:
    """Every sample of each request, from an engine with ``spec`` (``drafter`` replacing the
    registered speculator); the memory is ample, so nothing is preempted."""
    with pytest.MonkeyPatch.context() as mp:
        if drafter is not None:
            mp.setattr(spec_setup, "load_drafter", lambda *_: drafter)
        config = EngineConfig(max_num_batched_tokens=64, speculative_config=spec)
        engine = LLMEngine(model, tiny_tokenizer(), config)
        ids = [engine.add_request(p, sp) for p, sp in zip(prompts, params, strict=True)]
        done = engine.run()
    # No step failed: the engine would have recomputed its requests (a preemption).
    assert all(done[i].metrics and done[i].metrics.num_preemptions == 0 for i in ids)
    return [done[i].outputs for i in ids], engine


def _tokens(outputs: list[list[CompletionOutput]]) -> list[list[list[int]]]:
    return [[o.token_ids for o in outs] for outs in outputs]


def _bad_word(tokens: list[int], tokenizer: Tokenizer) -> str:
    """A word of two tokens that ``tokens`` spells in its middle: banned, the second token
    is never drawn right after the first."""
    for i in range(2, len(tokens) - 1):
        text = tokenizer.decode(tokens[i : i + 2])
        for word in (text.lstrip(), " " + text.lstrip()):
            if tokenizer.encode(word, add_special_tokens=False).ids == tokens[i : i + 2]:
                return text
    raise AssertionError("no two-token word in the output")


def _option_params(raw: list[list[int]], tokenizer: Tokenizer) -> list[SamplingParams]:
    """One request per option, each built to change its unconstrained greedy output ``raw``."""
    greedy = {"temperature": 0.0, "max_tokens": 12}
    return [
        # A biased token that repeats until the penalties take it down, then comes back.
        SamplingParams(**greedy, ignore_eos=True, logit_bias={raw[0][1]: 4.0}, logprobs=3,
                       presence_penalty=0.5, frequency_penalty=1.0, repetition_penalty=1.5),
        SamplingParams(**greedy, ignore_eos=True, logit_bias={raw[1][3]: -50.0, 77: 1.5}),
        SamplingParams(**greedy, ignore_eos=True, bad_words=[_bad_word(raw[2], tokenizer)]),
        SamplingParams(**greedy, ignore_eos=True, allowed_token_ids=list(range(3, 3000, 37))),
        # Stopping at once but for min_tokens.
        SamplingParams(**greedy, min_tokens=6, logit_bias={EOS: 30.0}, logprobs=0),
        SamplingParams(**greedy, ignore_eos=True, stop_token_ids=[raw[5][6]]),
    ]  # fmt: skip


@pytest.fixture(scope="module", params=["continuations", "mtp", "dspark"])
def option_runs(
    request: pytest.FixtureRequest, v4: DeepseekCausalLM, v41: DeepseekCausalLM
) -> Iterator[tuple[list[list[CompletionOutput]], list[list[CompletionOutput]], LLMEngine]]:
    """(without speculation, with it, the speculative engine) for one request per option."""
    model = v41 if request.param == "dspark" else v4
    prompts = _prompts(6, 3)
    free = [SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)] * len(prompts)
    raw, _ = _generate(model, prompts, free, None)
    params = _option_params([o[0].token_ids for o in raw], tiny_tokenizer())
    want, _ = _generate(model, prompts, params, None)
    for p, w, r in zip(params, _tokens(want), _tokens(raw), strict=True):
        assert w != r, p  # every option changes the output
    drafter = None
    if request.param == "continuations":
        known = [p + o[0].token_ids for p, o in zip(prompts * 2, want + raw, strict=True)]
        drafter = KnowingDrafter(known)
    spec = DSPARK if request.param == "dspark" else MTP
    got, engine = _generate(model, prompts, params, spec, drafter)
    yield want, got, engine


def test_every_option_keeps_greedy_outputs(option_runs) -> None:  # type: ignore[no-untyped-def]
    want, got, engine = option_runs
    assert _tokens(got) == _tokens(want)
    assert [o[0].finish_reason for o in got] == [o[0].finish_reason for o in want]
    assert engine.spec is not None and engine.spec.num_drafts > 0
    assert engine.pool.used_bytes == 0


def test_logprobs_equal_the_engine_without_speculation(option_runs) -> None:  # type: ignore[no-untyped-def]
    want, got, _ = option_runs
    reported = [(w[0], g[0]) for w, g in zip(want, got, strict=True) if w[0].logprobs]
    assert len(reported) == 2
    for w, g in reported:
        assert g.logprobs is not None and len(g.logprobs) == len(w.logprobs)
        for a, b in zip(w.logprobs, g.logprobs, strict=True):
            assert list(a) == list(b)  # the token, then the top alternatives, in order
            for token, value in a.items():
                assert b[token] == pytest.approx(value, abs=1e-4)
        assert g.cumulative_logprob == pytest.approx(w.cumulative_logprob, abs=1e-3)


@pytest.mark.parametrize("drafter", ["continuations", "mtp", "dspark"])
def test_structured_outputs_validate_and_keep_greedy_outputs(
    drafter: str, v4: DeepseekCausalLM, v41: DeepseekCausalLM
) -> None:
    """JSON-schema requests, greedy and sampled: every output validates; greedy ones equal
    the engine's without speculation (drafts the grammar rejects end the verified drafts)."""
    model = v41 if drafter == "dspark" else v4
    prompts = _prompts(3, 4)
    greedy = SamplingParams(temperature=0.0, max_tokens=80, structured_outputs={"json": SCHEMA})
    sampled = [
        SamplingParams(temperature=1.0, seed=s, max_tokens=80, structured_outputs={"json": SCHEMA})
        for s in range(3)
    ]
    params = [greedy] * 3 + sampled
    prompts = prompts + prompts
    want, _ = _generate(model, prompts[:3], params[:3], None)
    drafts = None
    if drafter == "continuations":
        free = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
        raw, _ = _generate(model, prompts[:3], [free] * 3, None)
        known = [p + o[0].token_ids for p, o in zip(prompts, want + raw, strict=True)]
        drafts = KnowingDrafter(known)
    spec = DSPARK if drafter == "dspark" else MTP
    cut = []
    verified = spec_sampling.verified_drafts

    def counted(req: Request, offered: Sequence[int], *args: Any) -> tuple[list[int], Any]:
        kept, masks = verified(req, offered, *args)
        cut.append(len(offered) - len(kept))
        return kept, masks

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(spec_sampling, "verified_drafts", counted)
        got, engine = _generate(model, prompts, params, spec, drafts)
    assert _tokens(got[:3]) == _tokens(want)
    for outs in got:
        assert outs[0].finish_reason == "stop", outs[0]
        jsonschema.validate(json.loads(outs[0].text), SCHEMA)
    assert engine.spec is not None and engine.spec.num_drafts > 0
    assert engine.spec.num_accepted > 0 or drafter == "mtp"  # random MTP weights: none kept
    assert sum(cut) > 0  # drafts the grammar rejected (or after a stop) went unverified


@pytest.mark.parametrize("drafter", ["continuations", "dspark"])
def test_n_samples_fork_and_speculate_each_on_its_own(
    drafter: str, v4: DeepseekCausalLM, v41: DeepseekCausalLM
) -> None:
    """``n`` = 3 greedy samples, one prompt of exactly one prefix-cache block: each sample
    emits the engine's greedy tokens without speculation; the samples fork from the first
    once its prompt has run; seeded samples draw their own tokens."""
    model = v41 if drafter == "dspark" else v4
    rnd = random.Random(6)
    prompts = [[rnd.randrange(3, 8000) for _ in range(n)] for n in (10, 128)]
    greedy = SamplingParams(n=3, temperature=0.0, max_tokens=10, ignore_eos=True)
    seeded = SamplingParams(n=2, temperature=1.0, seed=4, max_tokens=10, ignore_eos=True)
    want, _ = _generate(model, prompts, [greedy] * 2, None)
    known = [p + o[0].token_ids for p, o in zip(prompts, want, strict=True)]
    forks: list[Request] = []
    fork = engine_module.fork_for_speculation

    def counted(parent: Request, *args: Any) -> None:
        forks.append(parent)
        fork(parent, *args)

    spec = DSPARK if drafter == "dspark" else MTP
    drafts = KnowingDrafter(known) if drafter == "continuations" else None
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(engine_module, "fork_for_speculation", counted)
        got, engine = _generate(
            model, [*prompts, prompts[0]], [greedy, greedy, seeded], spec, drafts
        )
    assert len(forks) == 3
    for w, g in zip(_tokens(want), _tokens(got)[:2], strict=True):
        assert g == w and len(g) == 3
    first, second = _tokens(got)[2]
    assert first != second
    assert engine.spec is not None and engine.spec.num_accepted > 0
    assert engine.pool.used_bytes == 0


def _processed(
    model: DeepseekCausalLM, tokens: list[int], outputs: list[int], bias: dict[int, float]
) -> Tensor:
    """The sampler's distribution after ``tokens`` at temperature 1, recomputed in float64
    from its documented semantics: the logits plus the bias, less the presence penalty on
    each token generated so far (``outputs``), then the top-k."""
    x = model.forward_logits(torch.tensor([tokens]))[0, -1].double()
    for token, value in bias.items():
        x[token] += value
    for token in set(outputs):
        x[token] -= PRESENCE
    kept = torch.sort(-x, stable=True).indices[:TOP_K]
    out = torch.zeros_like(x)
    out[kept] = torch.softmax(x[kept], dim=-1)
    return out


def _chi_square_p(counts: Tensor, want: Tensor) -> float:
    """p-value of Pearson's chi-square test of ``counts`` against the distribution ``want``
    (bins expecting fewer than 5 draws are pooled); no draw may fall outside its support."""
    assert int(counts[want == 0].sum()) == 0, "a token outside the distribution was drawn"
    support = want > 0
    obs, exp = counts[support].double(), want[support] * float(counts.sum())
    small = exp < 5
    if bool(small.any()):
        obs = torch.cat((obs[small].sum().view(1), obs[~small]))
        exp = torch.cat((exp[small].sum().view(1), exp[~small]))
    stat = float(((obs - exp) ** 2 / exp).sum())
    dof = exp.numel() - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2), torch.tensor(stat / 2)))


def test_sampling_with_bias_and_penalty_keeps_the_processed_distribution(
    v4: DeepseekCausalLM,
) -> None:
    """Seeded requests of one prompt at temperature 1, top-k 4, with three tokens biased
    into the top and a presence penalty, verified against drafts of the processed greedy
    continuations (every third round's second draft corrupted): the second token given the
    first, and the third given the first two where the first draft was kept, follow the
    processed distribution there, which the penalty on the tokens before moves."""
    n = 1000
    prompt = _prompts(1, 9, 200)[0][:12]
    bias = {101: 8.0, 202: 8.0, 303: 8.0}  # far above every other token at any position
    first = _processed(v4, prompt, [], bias)
    sequences = []
    for t1 in first.nonzero()[:, 0].tolist():
        seq = [*prompt, t1]
        for _ in range(K):
            seq.append(int(_processed(v4, seq, seq[len(prompt) :], bias).argmax()))
        sequences.append(seq)
    params = [
        SamplingParams(temperature=1.0, top_k=TOP_K, seed=seed, max_tokens=3, ignore_eos=True,
                       logit_bias=bias, presence_penalty=PRESENCE)
        for seed in range(n)
    ]  # fmt: skip
    outs, engine = _generate(v4, [prompt] * n, params, MTP, KnowingDrafter(sequences))
    drawn = torch.tensor([o[0].token_ids for o in outs])
    assert engine.spec is not None and 0 < engine.spec.num_accepted < engine.spec.num_drafts
    vocab, moved = v4.cfg.vocab_size, []
    for seq in sequences:
        t1, a2 = seq[len(prompt)], seq[len(prompt) + 1]
        rows = drawn[:, 0] == t1
        for tokens in ([t1], [t1, a2]):
            if tokens[1:]:  # the first draft kept: the third token checks draft two
                rows &= drawn[:, 1] == a2
            if int(rows.sum()) < 100:
                continue
            want = _processed(v4, prompt + tokens, tokens, bias)
            counts = torch.bincount(drawn[rows, len(tokens)], minlength=vocab)
            assert _chi_square_p(counts, want) > 1e-3
            unpenalised = _processed(v4, prompt + tokens, [], bias)
            moved.append(float((want - unpenalised).abs().sum()) / 2)
    assert len(moved) >= 3
    assert sum(tv > 0.1 for tv in moved) >= 2  # where the penalty moves the distribution
