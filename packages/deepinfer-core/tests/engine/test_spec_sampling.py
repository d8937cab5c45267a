"""A speculative step's draws in one call of the sampler: the column-built inputs equal the
per-position rows', and each request's draws equal those it gets in a call of its own."""

from __future__ import annotations

import pytest
import torch

from deepinfer.engine import spec_sampling
from deepinfer.engine.request import Request
from deepinfer.engine.sampling_rows import SamplingRow, position_tensors, sampling_tensors
from deepinfer.engine.spec_sampling import step_targets
from deepinfer.outputs import RequestMetrics
from deepinfer.sampling_params import SamplingParams

VOCAB = 50


def _request(i: int, params: SamplingParams, outputs: int) -> Request:
    prompt = list(range(3, 3 + 4 + i))
    req = Request(f"r{i}", f"r{i}", 0, prompt, params, 1000 + i, RequestMetrics(0.0), 10_000)
    req.output_token_ids = [7 + (j % 5) for j in range(outputs)]
    return req


PLAIN = [
    SamplingParams(temperature=0.0),
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.7, top_k=5),
    SamplingParams(temperature=1.3, top_p=0.8, min_p=0.05),
    SamplingParams(temperature=0.9, top_k=-1, top_p=0.5),
]


def _requests(params: list[SamplingParams]) -> list[Request]:
    return [_request(i, p, outputs=i % 3) for i, p in enumerate(params)]


def test_column_built_inputs_equal_the_rows() -> None:
    """``position_tensors`` gives every column ``sampling_tensors`` gives the rows of the
    same positions (each request's next ``counts[i]`` positions)."""
    reqs = _requests(PLAIN)
    counts = [3, 1, 6, 2, 4]
    rows = [SamplingRow.of(r, [9] * j) for r, n in zip(reqs, counts, strict=True) for j in range(n)]
    want = sampling_tensors(rows, VOCAB, {2}, torch.device("cpu"))
    got = position_tensors(reqs, counts, torch.device("cpu"))
    for name in ("temperature", "top_k", "top_p", "min_p", "seeds", "positions", "sampled_rows"):
        assert torch.equal(getattr(got, name), getattr(want, name)), name
    assert got.any_top_k_top_p == want.any_top_k_top_p
    assert got.allowed is None and got.output_counts is None and got.logit_bias is None


@pytest.mark.parametrize("block_rows", [1, 7, 1000])
@pytest.mark.parametrize("penalized", [False, True])
def test_one_call_draws_what_each_request_draws_alone(
    penalized: bool, block_rows: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batched verification is row-wise: every request's drafts, draws and logprobs are the
    ones a call for it alone gives, however the step's requests are split into the sampler's
    calls (with a penalized request among them too, which takes the per-position rows for its
    call)."""
    monkeypatch.setattr(spec_sampling, "CPU_BLOCK_BYTES", block_rows * 4 * VOCAB)
    params = [*PLAIN, SamplingParams(temperature=0.8, frequency_penalty=0.5)][
        : len(PLAIN) + penalized
    ]
    reqs = _requests(params)
    gen = torch.Generator().manual_seed(0)
    offered = [[int(t) for t in torch.randint(3, VOCAB, (j,), generator=gen)] for j in (2, 0, 5)]
    offered = [offered[i % 3] for i in range(len(reqs))]
    logits = [torch.randn(len(o) + 1, VOCAB, generator=gen) * 3 for o in offered]
    batched = step_targets(reqs, offered, logits, {2}, image_token_id=VOCAB - 1)
    for req, o, x, got in zip(reqs, offered, logits, batched, strict=True):
        (alone,) = step_targets([req], [o], [x], {2}, image_token_id=VOCAB - 1)
        assert got.drafts == alone.drafts == o
        assert got.tokens == alone.tokens
        assert VOCAB - 1 not in got.tokens
        assert got.token_logprobs == pytest.approx(alone.token_logprobs)
        emitted, alone_emitted = got.emit(req, got.kept() + 1), alone.emit(req, alone.kept() + 1)
        assert [t for t, _ in emitted] == [t for t, _ in alone_emitted]
        assert [lp for _, lp in emitted] == pytest.approx([lp for _, lp in alone_emitted])


def test_a_stop_token_ends_the_verified_drafts() -> None:
    """Drafts from a stop token on are not verified; the draws cover the rest."""
    req = _request(0, SamplingParams(temperature=0.0), outputs=0)
    logits = torch.randn(5, VOCAB)
    (target,) = step_targets([req], [[4, 2, 6, 8]], [logits], {2})
    assert target.drafts == [4]
    assert target.tokens == logits[:2].argmax(-1).tolist()
