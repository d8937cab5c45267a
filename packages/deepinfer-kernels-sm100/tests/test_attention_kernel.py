"""The MQA-with-sinks kernel against the torch reference and a float64 recomputation."""

from __future__ import annotations

import pytest
import torch

from deepinfer.backends.torch_ref import TorchBackend
from deepinfer_kernels_sm100.attention import mqa_sink_attention

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize(
    "shape",
    [
        (3, 1, 8, 45, 64),
        (2, 7, 20, 33, 24),
        (1, 5, 16, 70, 32),
        (2, 1, 18, 40, 320),
        (33, 1, 16, 20, 320),
    ],
    ids=["decode", "chunk-odd-heads", "prefill", "wide-head", "wide-head-256-columns"],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_reference_and_float64(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    b, s, h, keys, dim = shape  # batch, queries, heads, keys, head dim
    g = torch.Generator().manual_seed(b * 100 + s)
    q = (torch.randn(b, s, h, dim, generator=g) * 2).to(dtype)
    kv = torch.randn(b, keys, dim, generator=g).to(dtype)
    mask = torch.rand(b, s, keys, generator=g) > 0.4
    mask[0, 0] = False  # a row that sees nothing: only the sink, so the output is zero
    sinks = torch.randn(h, generator=g)
    scale = dim**-0.5
    got = mqa_sink_attention(
        q.to(DEVICE), kv.to(DEVICE), mask.to(DEVICE), sinks.to(DEVICE), scale
    ).cpu()
    assert got.dtype == dtype and got.shape == q.shape
    want = TorchBackend("cpu").attention(q, kv, mask, sinks, scale)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)

    logits = torch.einsum("bshd,bld->bhsl", q.double(), kv.double()) * scale
    logits = logits.masked_fill(~mask[:, None], float("-inf"))
    sink = sinks.double().view(1, h, 1, 1).expand(b, h, s, 1)
    probs = torch.cat((logits, sink), -1).softmax(-1)[..., :-1]
    exact = torch.einsum("bhsl,bld->bshd", probs, kv.double())
    torch.testing.assert_close(got.double(), exact, atol=tol, rtol=tol)
    assert torch.equal(got[0, 0], torch.zeros_like(got[0, 0]))


@pytest.mark.parametrize(
    "shape",
    [(2, 9, 8, 50, 64, 20), (1, 33, 20, 70, 24, 40), (3, 1, 4, 10, 32, 0), (1, 3, 16, 60, 512, 40)],
    ids=["prefill", "odd-heads-many-keys", "no-keys", "wide-head"],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sparse_matches_reference_and_dense(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    """The sparse form against the reference's gather and against the dense kernel over the
    same keys as a mask."""
    from deepinfer_kernels_sm100.attention import sparse_mqa_sink_attention

    b, s, h, keys, dim, k = shape  # batch, queries, heads, kv rows, head dim, keys per query
    g = torch.Generator().manual_seed(b * 100 + s)
    q = (torch.randn(b, s, h, dim, generator=g) * 2).to(dtype)
    kv = torch.randn(b, keys, dim, generator=g).to(dtype)
    index = torch.stack([torch.randperm(keys, generator=g)[:k] for _ in range(b * s)])
    index = index.view(b, s, k).masked_fill(torch.rand(b, s, k, generator=g) > 0.7, -1)
    if k:
        index[0, 0] = -1  # a query that sees nothing: only the sink, so the output is zero
    sinks = torch.randn(h, generator=g)
    scale = dim**-0.5
    dev = [t.to(DEVICE) for t in (q, kv, index, sinks)]
    got = sparse_mqa_sink_attention(*dev, scale).cpu()
    assert got.dtype == dtype and got.shape == q.shape
    want = TorchBackend("cpu").sparse_attention(q, kv, index, sinks, scale)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)
    mask = torch.zeros(b, s, keys + 1, dtype=torch.bool)
    mask.scatter_(-1, torch.where(index < 0, keys, index), True)
    dense = mqa_sink_attention(dev[0], dev[1], mask[..., :keys].to(DEVICE), dev[3], scale).cpu()
    torch.testing.assert_close(got.float(), dense.float(), atol=tol, rtol=tol)
    assert torch.equal(got[0, 0], torch.zeros_like(got[0, 0]))


@pytest.mark.parametrize("splits", [2, 4])
@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_split_keys_match_float64(splits: int, sparse: bool, dtype: torch.dtype) -> None:
    """Keys cut into ranges whose partial softmaxes are merged afterwards (few decode rows):
    against float64, with a range that sees no key and a row that sees none at all."""
    from deepinfer_kernels_sm100.attention import sparse_mqa_sink_attention

    b, s, h, keys, dim = 2, 2, 20, 230, 48
    g = torch.Generator().manual_seed(splits)
    q = (torch.randn(b, s, h, dim, generator=g) * 2).to(dtype)
    kv = torch.randn(b, keys, dim, generator=g).to(dtype)
    mask = torch.rand(b, s, keys, generator=g) > 0.5
    mask[1, :, :128] = False  # row 1's first key blocks see nothing: an empty range
    mask[0, 0] = False  # sees nothing: only the sink, so the output is zero
    sinks = torch.randn(h, generator=g)
    scale = dim**-0.5
    dev = [t.to(DEVICE) for t in (q, kv, mask, sinks)]
    if sparse:  # the visible keys as lists, padded with -1
        index = torch.full((b, s, keys), -1)
        for i in range(b):
            for j in range(s):
                rows = mask[i, j].nonzero().flatten()
                index[i, j, : len(rows)] = rows
        got = sparse_mqa_sink_attention(
            dev[0], dev[1], index.to(DEVICE), dev[3], scale, splits=splits
        )
    else:
        got = mqa_sink_attention(*dev, scale, splits=splits)
    got = got.cpu()
    logits = torch.einsum("bshd,bld->bhsl", q.double(), kv.double()) * scale
    logits = logits.masked_fill(~mask[:, None], float("-inf"))
    sink = sinks.double().view(1, h, 1, 1).expand(b, h, s, 1)
    probs = torch.cat((logits, sink), -1).softmax(-1)[..., :-1]
    exact = torch.einsum("bhsl,bld->bshd", probs, kv.double())
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.double(), exact, atol=tol, rtol=tol)
    assert torch.equal(got[0, 0], torch.zeros_like(got[0, 0]))
    whole = mqa_sink_attention(*dev, scale, splits=1).cpu()
    torch.testing.assert_close(got.float(), whole.float(), atol=tol, rtol=tol)


def test_num_splits_fill_the_gpu() -> None:
    from deepinfer_kernels_sm100.attention import BLOCK_L, num_splits

    assert num_splits(programs=16, keys=640, target=264) == 10  # one key block each
    assert num_splits(programs=64, keys=4096, target=264) == 5
    assert num_splits(programs=512, keys=4096, target=264) == 1  # enough programs already
    assert num_splits(programs=4, keys=BLOCK_L, target=264) == 1  # one block: nothing to cut


def fp32_excess(
    got: torch.Tensor,
    q: torch.Tensor,
    kv: torch.Tensor,
    mask: torch.Tensor,
    sinks: torch.Tensor,
    *,
    scale: float,
) -> float:
    """How far bf16 outputs ``got`` are from the float64 result beyond rounding to bf16, in
    units of fp32's rounding (2^-24) of the terms summed (``sum_l p_l |v_l|``). On an H200 at
    these shapes IEEE fp32 dots measured 0.2-2.4 units and three bf16 parts 0.4-5.2; the
    probabilities rounded to one bf16 part missed by 5700-8200."""
    b, s, h, _ = q.shape
    logits = torch.einsum("bshd,bld->bhsl", q.double(), kv.double()) * scale
    logits = logits.masked_fill(~mask[:, None], float("-inf"))
    sink = sinks.double().view(1, h, 1, 1).expand(b, h, s, 1)
    probs = torch.cat((logits, sink), -1).softmax(-1)[..., :-1]
    exact = torch.einsum("bhsl,bld->bshd", probs, kv.double())
    terms = torch.einsum("bhsl,bld->bshd", probs, kv.double().abs())
    rounded = exact.to(torch.bfloat16).abs()
    up = torch.nextafter(rounded, torch.tensor(float("inf"), dtype=torch.bfloat16))
    beyond = ((got.double() - exact).abs() - (up - rounded).double()).clamp_min(0)
    return (beyond / (terms * 2.0**-24)).max().item()


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("b", "splits"), [(4, 1), (4, 3), (40, None)], ids=["whole", "split", "wide-columns"]
)
def test_bf16_values_meet_probabilities_exactly(b: int, splits: int | None) -> None:
    """bf16 keys and values at V4's head width (64 heads of 512): the fp32 probabilities meet
    the values in tensor-core dots of bf16 parts (40 rows: 256 output columns a program). The
    outputs must be as close to float64 as IEEE fp32 dots make them: within one bf16 step plus
    fp32's rounding of the sums."""
    s, h, keys, dim = 1, 64, 640, 512
    g = torch.Generator().manual_seed(b)
    q = (torch.randn(b, s, h, dim, generator=g) * 0.2).to(torch.bfloat16)
    kv = torch.randn(b, keys, dim, generator=g).to(torch.bfloat16)
    mask = torch.rand(b, s, keys, generator=g) > 0.1
    sinks = torch.randn(h, generator=g)
    scale = dim**-0.5
    got = mqa_sink_attention(*[t.cuda() for t in (q, kv, mask, sinks)], scale, splits=splits)
    assert fp32_excess(got.cpu(), q, kv, mask, sinks, scale=scale) < 16
