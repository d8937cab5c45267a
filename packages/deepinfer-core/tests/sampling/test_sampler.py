from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from deepinfer.sampling import SamplingTensors, filter_mask, rng, sample
from deepinfer.sampling.sampler import greedy


def _tensors(b: int, **kw: object) -> SamplingTensors:
    base: dict[str, object] = {
        "temperature": torch.ones(b),
        "top_k": torch.zeros(b, dtype=torch.int64),
        "top_p": torch.ones(b),
        "min_p": torch.zeros(b),
        "seeds": torch.zeros(b, dtype=torch.int64),
        "positions": torch.arange(b, dtype=torch.int64),
    }
    for key, value in kw.items():
        base[key] = value if isinstance(value, torch.Tensor) else torch.full((b,), value)
    return SamplingTensors(**base)  # type: ignore[arg-type]


def reference_distribution(
    logits: np.ndarray, temperature: float, top_k: int, top_p: float, min_p: float
) -> np.ndarray:
    """The filter spec written out in float64 with explicit loops (independent of the code)."""
    z = logits.astype(np.float64) / temperature
    p = np.exp(z - z.max())
    p /= p.sum()
    keep = p >= min_p * p.max()
    q = np.where(keep, p, 0.0)
    q /= q.sum()
    order = sorted(range(len(q)), key=lambda i: (-q[i], i))
    if top_k > 0:
        for rank, i in enumerate(order):
            if rank >= top_k:
                q[i] = 0.0
        q /= q.sum()
    if top_p < 1.0:
        mass = 0.0
        for rank, i in enumerate(order):
            if rank > 0 and mass >= top_p:
                q[i] = 0.0
            mass += q[i] if q[i] > 0 else 0.0
        q /= q.sum()
    return q


CASES = [
    (1.0, 0, 1.0, 0.0),
    (0.7, 0, 1.0, 0.0),
    (1.3, 4, 1.0, 0.0),
    (1.0, 0, 0.8, 0.0),
    (0.9, 0, 1.0, 0.05),
    (1.1, 6, 0.9, 0.02),
]


@pytest.mark.parametrize(("temperature", "top_k", "top_p", "min_p"), CASES)
def test_empirical_distribution_matches_softmax_chi_square(
    temperature: float, top_k: int, top_p: float, min_p: float
) -> None:
    g = np.random.default_rng(1)
    vocab, draws = 12, 40_000
    logits = g.normal(0, 1.5, size=vocab).astype(np.float32)
    want = reference_distribution(logits, temperature, top_k, top_p, min_p)
    t = _tensors(
        draws,
        temperature=temperature,
        top_k=torch.full((draws,), top_k, dtype=torch.int64),
        top_p=top_p,
        min_p=min_p,
        seeds=torch.full((draws,), 1234, dtype=torch.int64),
    )
    out = sample(torch.from_numpy(logits).expand(draws, vocab).contiguous(), t)
    counts = np.bincount(out.token_ids.numpy(), minlength=vocab)
    support = want > 0
    assert counts[~support].sum() == 0, "sampled a filtered token"
    chi = stats.chisquare(counts[support], want[support] * draws)
    assert chi.pvalue > 1e-3, (chi, counts, want)


def test_logit_bias_shifts_the_distribution_chi_square() -> None:
    """Draws with a bias follow softmax((logits + bias) / T), and filters see the biased
    logits; the reported logprobs stay the model's own."""
    g = np.random.default_rng(3)
    vocab, draws = 10, 40_000
    logits = g.normal(0, 1.0, size=vocab).astype(np.float32)
    bias = np.zeros(vocab, dtype=np.float32)
    bias[[2, 7]] = [2.5, -1.5]
    bias[9] = -100.0  # effectively banned
    want = reference_distribution(logits + bias, 0.8, 5, 1.0, 0.0)
    t = _tensors(draws, temperature=0.8, top_k=torch.full((draws,), 5, dtype=torch.int64))
    t.seeds = torch.full((draws,), 99, dtype=torch.int64)
    t.logit_bias = torch.from_numpy(bias).expand(draws, vocab)
    out = sample(torch.from_numpy(logits).expand(draws, vocab).contiguous(), t)
    counts = np.bincount(out.token_ids.numpy(), minlength=vocab)
    support = want > 0
    assert counts[~support].sum() == 0 and counts[9] == 0
    chi = stats.chisquare(counts[support], want[support] * draws)
    assert chi.pvalue > 1e-3, (chi, counts, want)
    raw = torch.log_softmax(torch.from_numpy(logits).double(), dim=-1)
    torch.testing.assert_close(out.logprobs.double(), raw[out.token_ids], atol=1e-5, rtol=0)


def test_filter_mask_matches_reference_on_random_rows() -> None:
    g = np.random.default_rng(2)
    for _ in range(200):
        vocab = int(g.integers(2, 40))
        # Coarse logits so that ties at the boundaries are common.
        logits = np.round(g.normal(0, 2, size=vocab)).astype(np.float32)
        temperature = float(g.uniform(0.3, 2.0))
        top_k = int(g.integers(0, vocab + 2))
        top_p = float(g.choice([1.0, g.uniform(0.05, 1.0)]))
        min_p = float(g.choice([0.0, g.uniform(0.0, 0.5)]))
        want = reference_distribution(logits, temperature, top_k, top_p, min_p) > 0
        probs = torch.softmax(torch.from_numpy(logits)[None] / temperature, dim=-1)
        got = filter_mask(
            probs, torch.tensor([top_k]), torch.tensor([top_p]), torch.tensor([min_p])
        )[0].numpy()
        assert got.tolist() == want.tolist(), (logits, temperature, top_k, top_p, min_p)


def test_greedy_breaks_ties_towards_lower_id() -> None:
    logits = torch.tensor([[0.0, 3.0, 3.0, 1.0]])
    out = sample(logits, _tensors(1, temperature=0.0))
    assert out.token_ids.item() == 1


def test_the_greedy_shortcut_is_the_samplers_greedy_draw() -> None:
    """``greedy`` (a verification step's draws when every row is greedy) gives the token ids
    and logprobs of ``sample`` on greedy rows, bit for bit: ties to the lower id, and the
    logprob the float64 log-softmax gives within fp32 rounding."""
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(9, 300, generator=g).mul(4).round().div(4)  # many ties
    logits[2, 7] = logits[2, 8] = logits[2].max() + 1
    want = sample(logits, _tensors(9, temperature=0.0))
    got = greedy(logits)
    assert torch.equal(got.token_ids, want.token_ids) and got.token_ids[2].item() == 7
    assert torch.equal(got.logprobs, want.logprobs)
    exact = torch.log_softmax(logits.double(), dim=-1).gather(-1, want.token_ids[:, None])
    assert torch.allclose(got.logprobs.double(), exact.squeeze(-1), atol=1e-5)


def test_seeded_draws_do_not_depend_on_the_batch() -> None:
    g = torch.Generator().manual_seed(0)
    row = torch.randn(1, 500, generator=g)
    t1 = _tensors(1, seeds=torch.tensor([77]), positions=torch.tensor([40]), top_p=0.9)
    alone = sample(row, t1).token_ids.item()
    for b in (2, 7, 31):
        others = torch.randn(b, 500, generator=g)
        idx = b // 2
        others[idx] = row[0]
        seeds = torch.randint(0, 1000, (b,), generator=g)
        seeds[idx] = 77
        positions = torch.randint(0, 1000, (b,), generator=g)
        positions[idx] = 40
        t = _tensors(b, seeds=seeds, positions=positions, top_p=0.9)
        assert sample(others, t).token_ids[idx].item() == alone


def test_allowed_mask_is_respected() -> None:
    draws = 2000
    logits = torch.zeros(draws, 6)
    allowed = torch.zeros(draws, 6, dtype=torch.bool)
    allowed[:, [1, 4]] = True
    out = sample(logits, _tensors(draws, allowed=allowed))
    assert set(out.token_ids.tolist()) == {1, 4}
    greedy = sample(logits, _tensors(draws, temperature=0.0, allowed=allowed))
    assert set(greedy.token_ids.tolist()) == {1}


def test_penalties_follow_openai_and_repetition_rules() -> None:
    logits = torch.tensor([[2.0, -1.0, 0.5, 1.0]])
    counts = torch.tensor([[2, 1, 0, 0]])
    prompt = torch.tensor([[False, False, False, True]])
    t = _tensors(
        1,
        temperature=0.0,
        presence_penalty=0.5,
        frequency_penalty=0.25,
        repetition_penalty=2.0,
        output_counts=counts,
        prompt_mask=prompt,
    )
    from deepinfer.sampling.sampler import apply_penalties

    got = apply_penalties(logits, t)[0].tolist()
    # token 0: 2/2 - 0.25*2 - 0.5; token 1: -1*2 - 0.25 - 0.5; token 2 untouched; token 3: 1/2
    assert got == pytest.approx([1.0 - 0.5 - 0.5, -2.0 - 0.25 - 0.5, 0.5, 0.5])


def test_logprobs_are_raw_model_logprobs() -> None:
    logits = torch.randn(3, 50, dtype=torch.float64)
    t = _tensors(3, temperature=0.5, top_k=torch.tensor([5, 5, 5]))
    out = sample(logits.float(), t, num_logprobs=4)
    ref = torch.log_softmax(logits, dim=-1)
    assert torch.allclose(
        out.logprobs.double(), ref.gather(-1, out.token_ids[:, None])[:, 0], atol=1e-5
    )
    want_ids = torch.argsort(-ref, dim=-1, stable=True)[:, :4]
    assert torch.equal(out.top_ids, want_ids)


@pytest.mark.gpu
def test_cuda_draws_equal_cpu_draws() -> None:
    """The counter RNG is exact integer arithmetic, so a seeded draw is device-independent."""
    g = torch.Generator().manual_seed(3)
    b, vocab = 64, 4096
    logits = torch.randn(b, vocab, generator=g)
    t = _tensors(
        b,
        seeds=torch.randint(0, 2**62, (b,), generator=g),
        positions=torch.randint(0, 10**6, (b,), generator=g),
        temperature=0.8,
    )
    cpu = sample(logits, t)
    moved = SamplingTensors(
        **{k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in vars(t).items()}
    )
    cuda = sample(logits.cuda(), moved)
    keys_cpu = rng.position_keys(t.seeds, t.positions)
    assert torch.equal(rng.position_keys(moved.seeds, moved.positions).cpu(), keys_cpu)
    assert torch.equal(rng.uniform(keys_cpu.cuda(), vocab).cpu(), rng.uniform(keys_cpu, vocab))
    assert torch.equal(cuda.token_ids.cpu(), cpu.token_ids)


def test_host_known_rows_give_the_same_draws() -> None:
    """The engine passes which rows sample and whether any filters by rank (so the sampler need
    not find out on the device); the draws are those found without the hints."""
    g = torch.Generator().manual_seed(4)
    b, vocab = 12, 512
    logits = torch.randn(b, vocab, generator=g) * 3
    temperature = torch.tensor([0.0, 1.0, 0.7, 0.0, 1.3, 1.0, 0.0, 0.9, 1.0, 0.0, 0.5, 1.0])
    top_k = torch.tensor([0, 0, 5, 0, 0, 40, 0, 0, 0, 7, 0, 0])
    top_p = torch.tensor([1.0, 0.9, 1.0, 1.0, 1.0, 1.0, 0.8, 0.95, 1.0, 1.0, 1.0, 1.0])
    t = _tensors(
        b,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        seeds=torch.randint(0, 2**62, (b,), generator=g),
    )
    plain = sample(logits, t)
    t.sampled_rows = torch.nonzero(temperature > 0).squeeze(-1)
    t.any_top_k_top_p = True
    hinted = sample(logits, t)
    assert torch.equal(hinted.token_ids, plain.token_ids)
    assert torch.equal(hinted.token_ids[temperature == 0], logits.argmax(-1)[temperature == 0])
    # No sampled row filters by rank: the sort is skipped, and the draws do not change.
    t = _tensors(b, temperature=temperature, seeds=t.seeds)
    plain = sample(logits, t)
    t.sampled_rows, t.any_top_k_top_p = torch.nonzero(temperature > 0).squeeze(-1), False
    assert torch.equal(sample(logits, t).token_ids, plain.token_ids)
