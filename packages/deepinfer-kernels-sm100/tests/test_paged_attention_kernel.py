"""Decode attention over keys read in place (a ring and paged entries) against float64 over
keys listed in Python, and against the same keys copied into one tensor (bit for bit in the
interpreter, to rounding on a GPU)."""

from __future__ import annotations

import pytest
import torch

from deepinfer.backends.torch_ref import TorchBackend
from deepinfer.paging import KeyPages
from deepinfer_kernels_sm100 import attention_decode
from deepinfer_kernels_sm100.attention import mqa_sink_attention, paged_mqa_sink_attention
from deepinfer_kernels_sm100.attention_paged import KeyPool

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(params=["heads_as_rows", "keys_as_rows"])
def kernel(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Which decode program runs bf16 rows of few heads: ``attention``'s own, or (any number
    of rows) ``attention_decode``'s transposed one."""
    if request.param == "keys_as_rows":
        monkeypatch.setattr(attention_decode, "MIN_ROWS", 0)
    else:
        monkeypatch.setattr(attention_decode, "ENABLED", False)
    return str(request.param)


def _source(  # noqa: PLR0917
    g: torch.Generator, b: int, pages: int, per_page: int, listed: int, dtype: torch.dtype, dim: int
) -> KeyPages:
    """A pool of ``pages + 3`` pages (the extra ones belong to no row), ``pages`` distinct pages
    a row and ``listed`` distinct entries a row, a third of them not seen (-1)."""
    pool = torch.randn(pages * b + 3, per_page, dim, generator=g).to(dtype)
    own = torch.randperm(pages * b + 3, generator=g)[: pages * b].view(b, pages)
    entries = torch.stack(
        [torch.randperm(pages * per_page, generator=g)[:listed] for _ in range(b)]
    )
    entries = entries.masked_fill(torch.rand(b, listed, generator=g) < 0.33, -1)
    return KeyPages(pool, own, entries[:, None])


def _listed_keys(src: KeyPages, row: int) -> list[torch.Tensor | None]:
    """Row ``row``'s keys of ``src`` by definition: entry e is ``pool[pages[e // n], e % n]``."""
    per = src.pool.shape[1]
    out: list[torch.Tensor | None] = []
    for e in src.entries[row, 0].tolist():
        out.append(None if e < 0 else src.pool[src.pages[row, e // per], e % per])
    return out


@pytest.mark.parametrize(
    "shape",
    [
        (3, 8, 64, 20, 2, 4, 7),
        (2, 16, 512, 40, 3, 32, 40),
        (2, 16, 64, 136, 33, 1, 33),
        (3, 8, 32, 20, 0, 4, 0),
    ],
    ids=["csa", "wide-head", "hca", "window-only"],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("splits", [None, 3])
def test_paged_keys_match_float64_and_the_copied_keys(
    shape: tuple[int, ...], dtype: torch.dtype, splits: int | None, kernel: str
) -> None:
    b, h, dim, capacity, pages, per_page, listed = shape
    g = torch.Generator().manual_seed(capacity + listed)
    q = (torch.randn(b, 1, h, dim, generator=g) * 2).to(dtype)
    ring = _source(g, b, 1, capacity, capacity, dtype, dim)  # one page (slot) a row
    sources = [ring]
    mixed = listed == 33  # HCA: entries held in fp32, read in the ring's dtype as a copy is
    if listed:
        entry_dtype = torch.float32 if mixed else dtype
        sources.append(_source(g, b, pages, per_page, listed, entry_dtype, dim))
    for s in sources:
        s.entries[0] = -1  # row 0 sees nothing: only the sink, so its output is zero
    sinks = torch.randn(h, generator=g)
    scale = dim**-0.5
    on = [KeyPages(*(t.to(DEVICE) for t in s)) for s in sources]
    got = paged_mqa_sink_attention(q.to(DEVICE), on, sinks.to(DEVICE), scale, splits=splits)
    got = got.cpu()
    assert got.dtype == dtype and got.shape == q.shape
    assert torch.equal(got[0], torch.zeros_like(got[0]))

    tol = 1e-5 if dtype == torch.float32 else 2e-2
    for row in range(b):
        keys = [k for s in sources for k in _listed_keys(s, row) if k is not None]
        kv = torch.stack(keys).to(dtype).double() if keys else torch.zeros(0, dim).double()
        logits = torch.einsum("hd,ld->hl", q[row, 0].double(), kv) * scale
        probs = torch.cat((logits, sinks.double()[:, None]), -1).softmax(-1)[:, :-1]
        torch.testing.assert_close(got[row, 0].double(), probs @ kv, atol=tol, rtol=tol)

    # The same keys copied into one tensor and masked: the reference's op, and the dense
    # kernel over that copy. Where the paged rows run the dense kernel's program (attention's
    # own), it walks the keys in the copy's order and blocks, and in the interpreter the two
    # agree bit for bit; attention_decode's transposed dots sum in another order, and on a GPU
    # bf16 rows differ in the last bits either way, so there to rounding.
    want = TorchBackend("cpu").paged_attention(q, sources, sinks, scale)
    torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)
    copied = torch.cat([s.pool.flatten(0, 1)[s.rows()].to(dtype) for s in sources], dim=1)
    mask = torch.cat([s.entries >= 0 for s in sources], dim=-1)
    dense = mqa_sink_attention(
        q.to(DEVICE), copied.to(DEVICE), mask.to(DEVICE), sinks.to(DEVICE), scale, splits=splits
    ).cpu()
    torch.testing.assert_close(got.float(), dense.float(), atol=tol, rtol=tol)
    pools = [KeyPool.of(s) for s in sources]
    same_program = not attention_decode.fits(q, pools[0], pools[-1])
    assert same_program == (kernel == "heads_as_rows" or dtype == torch.float32 or mixed)
    if DEVICE == "cpu" and same_program and not (mixed and dtype != torch.float32):
        assert torch.equal(got, dense)  # (the interpreter's fp32 -> bf16 casts truncate)


def test_paged_attention_refuses_several_queries_a_row() -> None:
    g = torch.Generator().manual_seed(0)
    ring = _source(g, 2, 1, 8, 8, torch.float32, 16)
    q = torch.randn(2, 3, 4, 16, generator=g)
    with pytest.raises(ValueError, match="one query a row"):
        paged_mqa_sink_attention(q.to(DEVICE), [ring], torch.zeros(4).to(DEVICE), 0.25)


@pytest.mark.parametrize(
    ("dim", "half"),
    [(64, 8), (512, 32), (512, 128)],
    ids=["narrow", "v4-rope", "rope-over-two-column-blocks"],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("splits", [None, 3])
def test_output_rotated_back_where_it_is_written(
    dim: int, half: int, dtype: torch.dtype, splits: int | None, kernel: str
) -> None:
    """``derotate``: the output's trailing 2 * half channels turned back at each row's angles
    by the program writing them (or merging the splits) equal the RoPE kernel's inverse turn
    of the plain output bit for bit, and the reference's two ops within rounding."""
    from deepinfer_kernels_sm100.elementwise import rope

    b, h = 3, 16
    g = torch.Generator().manual_seed(dim + half)
    q = (torch.randn(b, 1, h, dim, generator=g) * 2).to(dtype)
    sources = [_source(g, b, 1, 24, 24, dtype, dim), _source(g, b, 2, 8, 12, dtype, dim)]
    sinks = torch.randn(h, generator=g)
    angles = torch.rand(b, 1, half, generator=g) * 6.0
    cos, sin = angles.cos(), angles.sin()
    on = [KeyPages(*(t.to(DEVICE) for t in s)) for s in sources]
    args = (q.to(DEVICE), on, sinks.to(DEVICE), dim**-0.5)
    got = paged_mqa_sink_attention(*args, (cos.to(DEVICE), sin.to(DEVICE)), splits=splits)
    plain = paged_mqa_sink_attention(*args, splits=splits)
    turned = rope(plain, cos.to(DEVICE), sin.to(DEVICE), inverse=True)
    assert torch.equal(got, turned)
    assert not torch.equal(got, plain)  # the rope channels did turn
    assert torch.equal(got[..., : dim - 2 * half], plain[..., : dim - 2 * half])
    want = TorchBackend("cpu").paged_attention(q, sources, sinks, dim**-0.5, (cos, sin))
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.cpu().float(), want.float(), atol=tol, rtol=tol)
