"""RoPE angles memoised per forward call: right values, computed once per positions tensor,
and never shared between calls (a captured CUDA graph must record the computation)."""

from __future__ import annotations

import torch

from deepinfer.backends.torch_ref import TorchBackend
from deepinfer.models.layers.block import ForwardContext
from deepinfer.models.layers.rope import Rotary


def _tables() -> dict[str, Rotary]:
    scaling = {"type": "yarn", "factor": 16, "original_max_position_embeddings": 256}
    return {
        "main": Rotary.build(16, 10000.0, None, torch.device("cpu")),
        "compress": Rotary.build(16, 160000.0, scaling, torch.device("cpu")),
    }


def test_per_call_angles_match_float64_and_are_computed_once() -> None:
    tables = _tables()
    rotary = tables["main"].per_call()
    positions = torch.tensor([[0], [7], [4095]])
    cos, sin = rotary.cos_sin(positions)
    # fp32 angles (as the model rounds them), their cos/sin in float64
    angles = (positions.float()[..., None] * tables["main"].inv_freq).double()
    torch.testing.assert_close(cos.double(), angles.cos(), atol=1e-6, rtol=0)
    torch.testing.assert_close(sin.double(), angles.sin(), atol=1e-6, rtol=0)
    again = rotary.cos_sin(positions)
    assert again[0] is cos and again[1] is sin  # the same call, the same positions: reused
    other = rotary.cos_sin(positions.clone())  # equal values, another tensor: computed anew
    assert other[0] is not cos and torch.equal(other[0], cos)
    assert tables["main"].memo is None  # the model's own tables never memoise


def test_each_forward_call_gets_its_own_memo() -> None:
    tables = _tables()
    positions = torch.tensor([[3], [9]])
    first = ForwardContext(TorchBackend("cpu"), positions, positions, tables)
    second = ForwardContext(TorchBackend("cpu"), positions, positions, tables)
    a = first.rotary["compress"].cos_sin(positions)
    b = second.rotary["compress"].cos_sin(positions)
    assert a[0] is not b[0] and torch.equal(a[0], b[0])
    assert first.rotary["main"].memo is not second.rotary["main"].memo
