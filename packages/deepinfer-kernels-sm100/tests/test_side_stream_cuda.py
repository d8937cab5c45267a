"""The MoE's shared expert on a side stream (``deepinfer.models.layers.side_stream``) gives the
bits it gives in line, eagerly and replayed from a CUDA graph, and the overlap stops at
``MAX_ROWS``."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from deepinfer.assets import random_tiny_model
from deepinfer.models import weights_loaded
from deepinfer.models.layers import side_stream
from deepinfer.models.layers.moe import MoE
from deepinfer_kernels_sm100.backend import Sm100Backend

pytestmark = pytest.mark.gpu


def _moe(dtype: torch.dtype) -> tuple[MoE, Sm100Backend]:
    """A routed layer of the tiny V4 model on the kernels, projections fused as a load does."""
    ops = Sm100Backend("cuda")
    model = random_tiny_model(dtype=dtype, device="cuda", seed=3)
    model.ops = ops
    weights_loaded(model)
    layer = next(m for m in model.modules() if isinstance(m, MoE) and not m.gate.hashed)
    return layer, ops


def _inputs(moe: MoE, rows: int, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 1, moe.cfg.hidden_size, generator=g).to("cuda", dtype)
    ids = torch.randint(3, moe.cfg.vocab_size, (rows, 1), generator=g).to("cuda")
    return x, ids


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 24, 256])
def test_the_overlap_gives_the_in_line_bits(
    dtype: torch.dtype, rows: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    moe, ops = _moe(dtype)
    x, ids = _inputs(moe, rows, dtype)
    forked: list[int] = []
    make = side_stream.SideStream

    def counted(device: torch.device) -> side_stream.SideStream:
        forked.append(rows)
        return make(device)

    monkeypatch.setattr(side_stream, "SideStream", counted)
    with torch.inference_mode():
        overlapped = moe(ops, x, ids)
        assert forked, "the shared expert did not take the side stream"
        monkeypatch.setattr(Sm100Backend, "overlap_shared_experts", False)
        in_line = moe(ops, x, ids)
    torch.cuda.synchronize()
    assert len(forked) == 1
    assert torch.equal(overlapped, in_line)


def test_a_captured_step_replays_the_overlap(monkeypatch: pytest.MonkeyPatch) -> None:
    """Captured with the fork and the join inside, the graph's replay on new inputs gives the
    eager in-line result of those inputs."""
    moe, ops = _moe(torch.bfloat16)
    x, ids = _inputs(moe, 8, torch.bfloat16)
    fresh, fresh_ids = _inputs(moe, 9, torch.bfloat16)
    fresh, fresh_ids = fresh[:8], fresh_ids[:8]
    with torch.inference_mode():
        warm = torch.cuda.Stream()
        warm.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(warm):
            moe(ops, x, ids)  # lazy setup (the side stream, kernel compiles) off the capture
        torch.cuda.current_stream().wait_stream(warm)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = moe(ops, x, ids)
        x.copy_(fresh)
        ids.copy_(fresh_ids)
        graph.replay()
        replayed = out.clone()
        monkeypatch.setattr(Sm100Backend, "overlap_shared_experts", False)
        want = moe(ops, fresh, fresh_ids)
    assert torch.equal(replayed, want)


def test_past_max_rows_the_shared_expert_runs_in_line(monkeypatch: pytest.MonkeyPatch) -> None:
    moe, ops = _moe(torch.bfloat16)
    monkeypatch.setattr(side_stream, "MAX_ROWS", 16)
    made: list[torch.device] = []
    monkeypatch.setattr(side_stream, "SideStream", made.append)
    x, ids = _inputs(moe, 17, torch.bfloat16)
    with torch.inference_mode():
        moe(ops, x, ids)
    assert made == []
