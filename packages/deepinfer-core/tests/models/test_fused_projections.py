"""Attention's ``wq_a`` and ``wkv``, the shared expert's ``w1`` and ``w3``, a CSA layer's two
compressors' ``wkv`` and ``wgate`` (four projections of one input) and every other compressor's
pair, fused into one weight each, give the separate projections' logits.

The fused weight is the two stacked (:mod:`deepinfer.models.layers.fused`): the model's logits
must stay those of the unfused model (the same maths; only the GEMM's summation order may
differ), for float weights and for FP8 ones with block scales; the official names must still
report the same values, and no byte may be held twice. The shared expert's fused pair is also
what an MoE layer hands a backend that runs it among the routed experts
(``Backend.moe_experts_shared``), where it is held as they are.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from deepinfer.assets import random_tiny_model, tiny_fp8_config
from deepinfer.backends.torch_ref import TorchBackend
from deepinfer.models.causal_lm import DeepseekCausalLM
from deepinfer.models.checkpoint_config import QuantSettings
from deepinfer.models.deepseek_v4 import DeepseekV4ForCausalLM
from deepinfer.models.dummy_weights import fill_dummy_weights
from deepinfer.models.layers.attention import COMPRESSOR_PROJECTIONS, MQA, Attention
from deepinfer.models.layers.compressor import Compressor
from deepinfer.models.layers.fused import fusable, fuse_projections, fused_group
from deepinfer.models.layers.moe import Expert, MoE
from deepinfer.models.layers.norm import Linear
from deepinfer.models.stored_formats import hold_fp8


def _groups(model: DeepseekCausalLM) -> list[tuple[nn.Module, tuple[str, ...]]]:
    """The projection groups the model should fuse: each attention's ``wq_a``/``wkv``, each
    expert's ``w1``/``w3``, a CSA layer's four compressor projections, and the pair of every
    other compressor."""
    groups: list[tuple[nn.Module, tuple[str, ...]]] = []
    in_layer: set[int] = set()
    for m in model.modules():
        if isinstance(m, MQA):
            groups.append((m, ("wq_a", "wkv")))
        if isinstance(m, Attention) and m.indexer is not None:
            groups.append((m, COMPRESSOR_PROJECTIONS))
            in_layer |= {id(m.compressor), id(m.indexer.compressor)}
        if isinstance(m, Expert):
            groups.append((m, ("w1", "w3")))
    compressors = [m for m in model.modules() if isinstance(m, Compressor)]
    groups += [(m, ("wkv", "wgate")) for m in compressors if id(m) not in in_layer]
    assert in_layer and len(compressors) > len(in_layer)
    return groups


def _check_fused(model: DeepseekCausalLM, ids: torch.Tensor) -> None:
    want = model.forward_logits(ids)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    groups = _groups(model)
    assert fuse_projections(model) == len(groups)
    after = model.state_dict()
    assert after.keys() == before.keys()
    assert all(torch.equal(after[k], v) for k, v in before.items())
    for module, names in groups:
        fused = fused_group(module, *names)
        assert fused is not None
        row = 0
        for name in names:  # each member a row slice of the fused weight, in order
            member = module.get_submodule(name)
            assert member.weight.data_ptr() == fused.weight[row:].data_ptr()
            row += member.weight.shape[0]
        assert row == fused.weight.shape[0]
    got = model.forward_logits(ids)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_fused_float_projections_keep_the_logits() -> None:
    model = random_tiny_model(torch.float32, seed=3)
    ids = torch.randint(3, 200, (2, 19), generator=torch.Generator().manual_seed(4))
    _check_fused(model, ids)


def test_fused_fp8_projections_keep_the_logits() -> None:
    """FP8 e4m3 weights with 128 x 128 block scales: the scales stack with the rows."""
    model = DeepseekV4ForCausalLM(tiny_fp8_config(), dtype=torch.float32)
    quant = QuantSettings(quant_method="fp8", weight_block_size=(128, 128), expert_dtype="fp4")
    assert hold_fp8(model, quant)
    fill_dummy_weights(model, seed=5)
    attn = next(m for m in model.modules() if isinstance(m, MQA))
    assert attn.wq_a.scale is not None and attn.wkv.scale is not None
    ids = torch.randint(3, 200, (1, 23), generator=torch.Generator().manual_seed(6))
    _check_fused(model, ids)


def test_a_converted_model_runs_the_pair_apart() -> None:
    """``.to()`` makes new tensors of the registered projections but not of the fused weight,
    which is then left out rather than read stale."""
    ids = torch.randint(3, 200, (1, 9), generator=torch.Generator().manual_seed(8))
    want = random_tiny_model(torch.float32, seed=3).to(torch.float64).forward_logits(ids)
    model = random_tiny_model(torch.float32, seed=3)
    fuse_projections(model)
    model.to(torch.float64)
    attn = next(m for m in model.modules() if isinstance(m, MQA))
    assert attn.wq_a.weight.dtype == torch.float64
    assert attn.__dict__["_fused_wq_a_wkv"].weight.dtype == torch.float32
    torch.testing.assert_close(model.forward_logits(ids), want, rtol=0, atol=0)


def test_only_projections_held_alike_fuse() -> None:
    a, b = Linear(64, 128, torch.float32), Linear(64, 32, torch.float32)
    assert fusable(a, b)
    assert not fusable(a, Linear(64, 32, torch.bfloat16))  # dtypes differ
    assert not fusable(a, Linear(48, 32, torch.float32))  # input widths differ
    assert not fusable(a, Linear(64, 32, torch.float32, computes_fp32=True))
    c = Linear(128, 256, torch.float32)
    c.hold_fp8((128, 128))
    assert not fusable(c, Linear(128, 128, torch.float32))  # one FP8, one not


def _moes(model: nn.Module) -> list[MoE]:
    return [m for m in model.modules() if isinstance(m, MoE)]


def test_the_shared_expert_joins_the_routed_kernels_only_where_held_as_they_are() -> None:
    """``MoE.fused_shared``: the shared expert's fused gate/up weight and its down weight once
    the pair is fused and both are float and shaped as a routed expert's; never for FP8 shared
    experts beside FP4 routed ones, nor once a conversion has dropped the fused weight."""
    model = random_tiny_model(torch.float32, seed=3)
    assert all(m.fused_shared() is None for m in _moes(model))  # gate and up apart
    fuse_projections(model)
    for moe in _moes(model):
        found = moe.fused_shared()
        assert found is not None
        w13, w2 = found
        shared = moe.shared_experts
        assert w13.data_ptr() == shared.w1.weight.data_ptr()
        assert w13.shape == moe.experts.w13[0].shape
        assert w2 is shared.w2.weight and w2.shape == moe.experts.w2[0].shape
    model.to(torch.float64)
    assert all(m.fused_shared() is None for m in _moes(model))
    stored = DeepseekV4ForCausalLM(tiny_fp8_config(), dtype=torch.float32)
    quant = QuantSettings(quant_method="fp8", weight_block_size=(128, 128), expert_dtype="fp4")
    assert hold_fp8(stored, quant)
    fuse_projections(stored)
    assert all(m.fused_shared() is None for m in _moes(stored))


class _FusingReference(TorchBackend):
    """The reference's ops, asked to run shared experts through ``moe_experts_shared`` (its
    default: the dense ops as the routed experts' residual), counting the calls."""

    fuses_shared_expert = True
    calls = 0

    def moe_experts_shared(self, *args: Any, **kw: Any) -> torch.Tensor:
        self.calls += 1
        return super().moe_experts_shared(*args, **kw)


def test_a_backend_fusing_shared_experts_keeps_the_logits() -> None:
    """The layer hands ``moe_experts_shared`` the shared expert's own weights: through the
    op's reference composition the logits are the separate path's (fp32: summation order
    only), and the op is called once a layer."""
    ids = torch.randint(3, 200, (2, 13), generator=torch.Generator().manual_seed(9))
    model = random_tiny_model(torch.float32, seed=3)
    fuse_projections(model)
    want = model.forward_logits(ids)
    ops = model.ops = _FusingReference("cpu")
    torch.testing.assert_close(model.forward_logits(ids), want, rtol=1e-5, atol=1e-5)
    assert ops.calls == len(_moes(model.layers))  # the MTP layer's MoE takes no part here
