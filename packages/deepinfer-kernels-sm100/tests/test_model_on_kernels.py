"""The tiny V4 and V4.1 models with every sm100 kernel in place give the reference's logits.

Off the GPU the backend cannot be constructed (no CUDA), so its op table is bound to the CPU
directly and the kernels run in Triton's interpreter.

A model in the stored formats quantises its activations to e4m3, so a last-bit difference
upstream can move one across a rounding midpoint (or a routing top-k across a near-tie) and
its logits are not comparable that way. There every stored-format op is checked where the
model calls it instead: the kernel and the reference run on the very inputs the kernel model
passes, and must agree to fp32 summation order.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import Tensor

from deepinfer.assets import random_tiny_model, tiny_fp8_config, tiny_model
from deepinfer.backends.base import Fp8Activation, Fp8Output
from deepinfer.backends.torch_ref import TorchBackend
from deepinfer.cache.slots import StateSlots
from deepinfer.models.batch import ForwardBatch
from deepinfer.models.checkpoint_config import QuantSettings
from deepinfer.models.deepseek_v4 import DeepseekV4ForCausalLM
from deepinfer.models.dummy_weights import fill_dummy_weights
from deepinfer.models.layers.fused import fuse_projections
from deepinfer.models.layers.moe import MoE
from deepinfer.models.stored_formats import (
    fp32_projections,
    hold_bf16_projections,
    hold_fp4,
    hold_fp8,
)
from deepinfer_kernels_sm100.backend import Sm100Backend

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _kernel_ops() -> Sm100Backend:
    ops = object.__new__(Sm100Backend)  # skip the availability check: no GPU here
    ops.device = torch.device(DEVICE)
    return ops


def _stored_formats_model() -> DeepseekV4ForCausalLM:
    """A tiny V4 model whose plain projections hold FP8 weights and whose routed experts hold
    FP4 ones, as ``quantization="auto"`` loads a published checkpoint; the reference runs them
    through the torch ``fp8_linear`` and ``moe_experts_fp4``."""
    model = DeepseekV4ForCausalLM(tiny_fp8_config(), dtype=torch.float32, device=DEVICE)
    quant = QuantSettings(quant_method="fp8", weight_block_size=(128, 128), expert_dtype="fp4")
    assert hold_fp8(model, quant) and hold_fp4(model, quant)
    fill_dummy_weights(model, seed=3)
    return model.eval()


BUILDERS: dict[str, Callable[[], DeepseekV4ForCausalLM]] = {
    "v4": lambda: random_tiny_model(device=DEVICE, seed=3),
    "v41": lambda: tiny_model(device=DEVICE),
}


@pytest.mark.parametrize("name", list(BUILDERS))
def test_logits_match_the_reference(name: str) -> None:
    model = BUILDERS[name]()
    want = _run(model)
    model.ops = _kernel_ops()
    got = _run(model)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, atol=2e-4, rtol=2e-4)


@pytest.mark.parametrize("name", list(BUILDERS))
def test_query_blocks_give_the_reference_logits(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """As above with every prefill chunk's sparse attention in blocks of queries
    (``attention_blocks``, which real chunks of 64 or more queries take): the packed prompts'
    windows, entries and indexer picks as the model lists them."""
    from deepinfer_kernels_sm100 import attention_blocks

    calls: list[tuple[int, ...]] = []
    blocks = attention_blocks.block_sparse_attention

    def counted(q: Tensor, *args: Any) -> Tensor:
        calls.append(tuple(q.shape))
        return blocks(q, *args)

    monkeypatch.setattr(attention_blocks, "MIN_QUERIES", 1)
    monkeypatch.setattr(attention_blocks, "block_sparse_attention", counted)
    model = BUILDERS[name]()
    want = _run(model)
    model.ops = _kernel_ops()
    got = _run(model)
    assert calls, "no chunk took the block kernel"
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, atol=2e-4, rtol=2e-4)


def _run(model: DeepseekV4ForCausalLM) -> list[torch.Tensor]:
    """Logits of a packed prefill of two prompts, then two decode steps. The longer prompt
    gives the tiny V4's ratio-4 indexers more entries than their top-k (37 // 4 > 8), so the
    picks are a choice; the kernels run interpreted in CI, so nothing is longer than that."""
    top = min(model.cfg.vocab_size, model.cfg.image_token_id or model.cfg.vocab_size)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, top, (n,), generator=g).to(DEVICE) for n in (37, 9)]
    steps = torch.randint(3, top, (2, 2), generator=g).to(DEVICE)
    states = [model.new_state(1) for _ in prompts]
    out = [model(ForwardBatch.build(prompts, states)).logits]
    out += [model(ForwardBatch.decode(ids, states)).logits for ids in steps]
    return out


@pytest.mark.parametrize("name", list(BUILDERS))
def test_slot_rows_with_fused_projections_match_the_reference(name: str) -> None:
    """The engine's layout: states in shared slot rows, a packed prefill, then decode steps
    (every compressor's window kernel over the slot buffers), with the projections fused as a
    load fuses them for this backend (the shared experts then run as one more expert of the
    grouped kernels), give the reference's logits on its own slot rows."""
    model = BUILDERS[name]()
    want = _run_slots(model)
    model.ops = _kernel_ops()
    assert fuse_projections(model) > 0
    moes = [m for m in model.modules() if isinstance(m, MoE)]
    assert model.ops.fuses_shared_expert and all(m.fused_shared() is not None for m in moes)
    got = _run_slots(model)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, atol=2e-4, rtol=2e-4)


def _run_slots(model: DeepseekV4ForCausalLM) -> list[torch.Tensor]:
    """:func:`_run`'s prompts and steps (five of them, so ratio-4 windows complete) over slot
    rows."""
    top = min(model.cfg.vocab_size, model.cfg.image_token_id or model.cfg.vocab_size)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, top, (n,), generator=g).to(DEVICE) for n in (37, 9)]
    steps = torch.randint(3, top, (5, 2), generator=g).to(DEVICE)
    slots = StateSlots(
        lambda: model.new_state(1), max_slots=2, max_len=64, initial_slots=2, initial_pages=8
    )
    states = [slots.new_state() for _ in prompts]
    out = [model(ForwardBatch.build(prompts, states)).logits]
    out += [model(ForwardBatch.decode(ids, states)).logits for ids in steps]
    return out


#: What Hopper's fp8 tensor cores may add per output to fp32 summation: they keep about 14 bits
#: while summing a 128-wide K step (DeepSeek-V3's report), up to 2**-11 sum |a||w| (the
#: derivation is in ``test_fp8_linear_kernel.py``). The interpreter sums in fp32.
TENSOR_CORE_REL = 2.0**-11 if DEVICE == "cuda" else 0.0


class _CheckedKernels(Sm100Backend):
    """The kernels, each stored-format op also run by the torch reference on the same inputs;
    the largest error relative to what the op may differ by is kept per op (at most 1)."""

    def _check(self, name: str, got: Tensor, want: Tensor, allowed: Tensor | float) -> Tensor:
        excess = (got.float() - want.float()).abs() / allowed
        self.worst[name] = max(self.worst.get(name, 0.0), float(excess.max()))
        return got

    def _relative(self, name: str, got: Tensor, want: Tensor) -> Tensor:
        """fp32 sums of up to 128-wide K in another order: a few units of 2**-24 of the
        output's scale."""
        return self._check(name, got, want, 1e-5 * (float(want.abs().max()) or 1.0))

    def fp8_linear(
        self,
        x: Tensor,
        weight: Tensor,
        scale: Tensor,
        block: tuple[int, int],
        x_fp8: Fp8Activation | None = None,
    ) -> Tensor:
        """The kernel on the codes its input's producer handed over (``x_fp8``), the reference
        quantising ``x`` itself: so the handed-over codes are checked too."""
        want = TorchBackend.fp8_linear(self, x, weight, scale, block)
        got = super().fp8_linear(x, weight, scale, block, x_fp8)
        # sum |a||w| of the quantised operands: e4m3 and its quantisation are sign-symmetric.
        magnitude = weight.float().abs().to(weight.dtype)
        abs_sum = TorchBackend.fp8_linear(self, x.abs(), magnitude, scale, block).float()
        out_u = 2.0**-8 if got.dtype == torch.bfloat16 else 2.0**-24
        arith = (x.shape[-1] * 2.0**-23 + TENSOR_CORE_REL) * abs_sum
        allowed = arith + out_u * (want.float().abs() + arith) + 1e-30
        return self._check("fp8_linear", got, want, allowed)

    def swiglu(self, gate: Tensor, up: Tensor, swiglu_limit: float) -> Tensor:
        want = TorchBackend.swiglu(self, gate, up, swiglu_limit)
        return self._relative("swiglu", super().swiglu(gate, up, swiglu_limit), want)

    def swiglu_fp8(self, gate: Tensor, up: Tensor, swiglu_limit: float) -> Fp8Output:
        want = TorchBackend.swiglu(self, gate, up, swiglu_limit)
        h, h_fp8 = super().swiglu_fp8(gate, up, swiglu_limit)
        return self._relative("swiglu", h, want), h_fp8

    def moe_experts_fp4(self, x: Tensor, weights: Tensor, indices: Tensor, **w: Any) -> Tensor:
        want = TorchBackend.moe_experts_fp4(self, x, weights, indices, **w)
        return self._relative(
            "moe_experts_fp4", super().moe_experts_fp4(x, weights, indices, **w), want
        )


def test_stored_format_ops_match_the_reference_inside_the_model() -> None:
    model = _stored_formats_model()
    ops = object.__new__(_CheckedKernels)
    ops.device = torch.device(DEVICE)
    ops.worst = {}
    model.ops = ops
    _run(model)
    assert set(ops.worst) == {"fp8_linear", "swiglu", "moe_experts_fp4"}
    assert all(v <= 1.0 for v in ops.worst.values()), ops.worst


def _round_fp32_projections(model: DeepseekV4ForCausalLM) -> None:
    """Round the weights of the projections computed in fp32 to bf16 values, as a DeepSeek
    checkpoint stores them (still held in fp32)."""
    for _, module in fp32_projections(model):
        module.weight.data.copy_(module.weight.to(torch.bfloat16))


@pytest.mark.parametrize("two_parts_from", [None, 64])
def test_bf16_held_projections_give_the_fp32_logits(
    two_parts_from: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Held in bf16, the head, router gates and compressors give the reference's fp32-held
    logits: exactly on the reference (it widens them back), to fp32 summation order on the
    kernels (bf16 products on tensor cores, the head's fp32 input split in bf16 parts: three
    at the tiny model's width, and two, as wider heads take them, with ``two_parts_from``)."""
    if two_parts_from is not None:
        from deepinfer_kernels_sm100 import split_linear

        monkeypatch.setattr(split_linear, "TWO_PARTS_MIN_K", two_parts_from)
    model = random_tiny_model(device=DEVICE, seed=3)
    _round_fp32_projections(model)
    want = _run(model)
    kept = hold_bf16_projections(model, fp32_input_min_bytes=0)  # at every size
    assert "head.weight" in kept and any(n.endswith("gate.weight") for n in kept)
    assert any(n.endswith("compressor.wkv.weight") for n in kept)
    assert model.head.weight.dtype == torch.bfloat16
    for a, b in zip(_run(model), want, strict=True):
        assert torch.equal(a, b)
    model.ops = _kernel_ops()
    for a, b in zip(_run(model), want, strict=True):
        torch.testing.assert_close(a, b, atol=2e-4, rtol=2e-4)


def test_projections_not_exact_in_bf16_stay_fp32() -> None:
    """The embedded model's head was trained and stored in fp32: holding it in bf16 would
    round it, so it stays."""
    model = tiny_model(device=DEVICE)
    kept = hold_bf16_projections(model, fp32_input_min_bytes=0)
    assert "head.weight" not in kept and model.head.weight.dtype == torch.float32


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_an_fp32_model_holds_only_large_projections_in_bf16(dtype: torch.dtype) -> None:
    """An fp32 model's projections take fp32 inputs, which a bf16 weight's product splits in
    parts: it keeps its small projections (the tiny model's all) in fp32 and holds in bf16 only
    those of at least ``FP32_INPUT_HOLD_MIN_BYTES``; a bf16 model holds every exact one."""
    model = random_tiny_model(dtype=dtype, device=DEVICE, seed=3)
    _round_fp32_projections(model)
    names = {f"{n}.weight": m.weight.numel() * 4 for n, m in fp32_projections(model)}
    kept = hold_bf16_projections(model)
    if dtype == torch.bfloat16:
        assert kept == set(names)
        return
    assert not kept
    head = names["head.weight"]
    assert hold_bf16_projections(model, fp32_input_min_bytes=head) == {"head.weight"}
