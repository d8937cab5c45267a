"""CUDA graphs of whole decode steps over state slots: replays give the eager step's logits.

The eager decode step is itself checked against per-sequence forwards (test_batched_forward)
and those against transformers / float64; here the graphed step must match it while batches
are padded to buckets, graphs are reused across steps and batch sizes change.
"""

from __future__ import annotations

import pytest
import torch
from _tiny_models import text_ids

from deepinfer import plugins
from deepinfer.assets import TINY_DIR, random_tiny_model, tiny_model
from deepinfer.backends.torch_ref import TorchBackend
from deepinfer.cache.slots import StateSlots
from deepinfer.models.batch import ForwardBatch
from deepinfer.models.graphs import DecodeGraphs, decode_buckets, entry_bucket, entry_buckets
from deepinfer.models.state import ModelState


def test_buckets_cover_every_batch_up_to_the_maximum() -> None:
    assert decode_buckets(1) == [1]
    assert decode_buckets(10) == [1, 2, 4, 8, 10]
    sizes = decode_buckets(256)
    assert sizes[:5] == [1, 2, 4, 8, 16] and sizes[-1] == 256
    assert all(b % 8 == 0 for b in sizes[3:])
    assert entry_buckets(1) == [1] and entry_buckets(32) == [1, 4, 16, 32]
    assert [entry_bucket(n, 32) for n in (1, 2, 4, 5, 17, 32)] == [1, 4, 4, 16, 32, 32]
    with pytest.raises(ValueError, match="max_batch"):
        DecodeGraphs(0)


def test_cpu_tensors_run_eagerly() -> None:
    graphs = DecodeGraphs(8)
    x = torch.ones(3, 2)
    out = graphs.run("layer", lambda t: (t * 2,), x)
    assert torch.equal(out[0], x * 2) and graphs.num_captured == 0


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["v4", "v41"])
def test_graphed_decode_equals_eager_decode(name: str) -> None:
    """States in shared slot tensors (the whole step is graphed, per batch and entry bucket),
    which grow between captures, while the longest sequence passes 128 tokens (from 1 entry
    page to 2: the next entry bucket, 4 pages), against states of their own decoded eagerly
    (one-token packed spans)."""
    if name == "v41" and not (TINY_DIR / "model.safetensors").is_file():
        pytest.skip("the trained tiny model is not embedded")
    if "sm100" not in plugins.backends.names():
        pytest.skip("the sm100 backend (the one that supports graphs) is not installed")
    ops = plugins.backends.load("sm100")("cuda")
    assert ops.supports_cuda_graphs(torch.float32)
    if name == "v4":
        model = random_tiny_model(torch.float32, device="cuda", seed=3)
    else:
        model = tiny_model(torch.float32, device="cuda")
    model.ops = ops
    gen = torch.Generator().manual_seed(0)
    slots = StateSlots(lambda: model.new_state(1), max_slots=16, max_len=1024, initial_slots=4)
    eager: list[ModelState] = []
    graphed: list[ModelState] = []
    graphs = DecodeGraphs(max_batch=16)
    worst = 0.0
    for n, steps in ((3, 4), (13, 6), (3, 4)):  # 13 pads to 16; the second 3 reuses bucket 4
        while len(eager) < n:  # new sequences (the slot tensors grow past 4)
            prompt = text_ids(model, gen, 20 + 7 * len(eager) if eager else 125).cuda()
            eager.append(model.new_state(1))
            graphed.append(slots.new_state())
            model(ForwardBatch.build([prompt], eager[-1:]))
            model(ForwardBatch.build([prompt], graphed[-1:]))
        for _ in range(steps):
            ids = text_ids(model, gen, n)
            want = model(ForwardBatch.decode(ids, eager[:n])).logits
            got = model(ForwardBatch.decode(ids, graphed[:n]), graphs).logits
            worst = max(worst, float((want - got).abs().max()))
    # V4.1 fp32 on CUDA differs by ~1e-5 between batchings already (index top-k near-ties).
    assert worst < 5e-5, worst
    # Batch bucket 4 at entry buckets 1 and 4 (the 4th step reaches 129 tokens), 16 at 4, and
    # 4 at 4 again for the grown slot tensors.
    assert graphs.num_captured == 4


class _CapturingTorch(TorchBackend):
    """The torch reference, claiming graph support: on the CPU ``DecodeGraphs.run`` then calls
    the step function that a GPU would capture (entries read up to the entry bucket)."""

    def supports_cuda_graphs(self, dtype: torch.dtype) -> bool:
        return True


@pytest.mark.parametrize("name", ["v4", "v41"])
def test_capturable_step_equals_per_row_decode(name: str) -> None:
    """The whole-step function a graph records (every slot row, the entries of a whole entry
    bucket, Engram history included) gives the per-request decode's logits on the CPU."""
    if name == "v41" and not (TINY_DIR / "model.safetensors").is_file():
        pytest.skip("the trained tiny model is not embedded")
    model = random_tiny_model(torch.float32, seed=3) if name == "v4" else tiny_model(torch.float32)
    model.ops = _CapturingTorch()
    slots = StateSlots(lambda: model.new_state(1), max_slots=8, max_len=512)
    gen = torch.Generator().manual_seed(1)
    own = [model.new_state(1) for _ in range(5)]
    slotted = [slots.new_state() for _ in range(5)]
    for i, (a, b) in enumerate(zip(own, slotted, strict=True)):
        # Lengths around the compress boundaries, and one that passes 128 tokens while decoding
        # (entry bucket 1 page, then 4).
        prompt = text_ids(model, gen, 9 + 13 * i if i < 4 else 125)
        model(ForwardBatch.build([prompt], [a]))
        model(ForwardBatch.build([prompt], [b]))
    graphs = DecodeGraphs(max_batch=8)
    for _ in range(6):
        ids = text_ids(model, gen, 5)
        want = model(ForwardBatch.decode(ids, own)).logits
        got = model(ForwardBatch.decode(ids, slotted), graphs).logits
        # Reading the whole bucket changes matmul shapes, so fp32 rounding may differ.
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-5)
    # The slot pass advances positions alone; the layers' counters, read afterwards, are
    # those the span-by-span run wrote for the same tokens.
    for a, b in zip(own, slotted, strict=True):
        assert b.counters_behind and _counters(b) == _counters(a)
        assert not b.counters_behind


def _counters(state: ModelState) -> list[tuple[int, ...]]:
    """Every layer's host counters: ring length, then each compressor's fill and count."""
    out = []
    for layer in state.layers:
        comps = [c for c in (layer.compressor, layer.indexer) if c is not None]
        out.append((layer.swa.length, *(n for c in comps for n in (c.fill, c.count))))
    return out
