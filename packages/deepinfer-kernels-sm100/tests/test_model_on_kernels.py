"""The tiny V4 and V4.1 models with every sm100 kernel in place give the reference's logits.

Off the GPU the backend cannot be constructed (no CUDA), so its op table is bound to the CPU
directly and the kernels run in Triton's interpreter.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from deepinfer.assets import random_tiny_model, tiny_fp8_config, tiny_model
from deepinfer.models.batch import ForwardBatch
from deepinfer.models.checkpoint_config import QuantSettings
from deepinfer.models.deepseek_v4 import DeepseekV4ForCausalLM
from deepinfer.models.dummy_weights import fill_dummy_weights
from deepinfer.models.stored_formats import hold_fp4, hold_fp8
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
    "v4-fp8-fp4": _stored_formats_model,
}


@pytest.mark.parametrize("name", list(BUILDERS))
def test_logits_match_the_reference(name: str) -> None:
    model = BUILDERS[name]()
    top = min(model.cfg.vocab_size, model.cfg.image_token_id or model.cfg.vocab_size)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, top, (n,), generator=g).to(DEVICE) for n in (37, 21)]
    steps = torch.randint(3, top, (3, 2), generator=g).to(DEVICE)

    def run() -> list[torch.Tensor]:
        states = [model.new_state(1) for _ in prompts]
        out = [model(ForwardBatch.build(prompts, states)).logits]
        out += [model(ForwardBatch.decode(ids, states)).logits for ids in steps]
        return out

    want = run()
    model.ops = _kernel_ops()
    got = run()
    for a, b in zip(got, want, strict=True):
        if name.endswith("fp4"):
            assert _relative_rms(a, b) <= FP8_STEP_NOISE
        else:
            torch.testing.assert_close(a, b, atol=2e-4, rtol=2e-4)


#: Relative RMS change of a projection's output when its activations are rounded to e4m3 (3
#: mantissa bits: a uniform relative error within 2**-4, RMS 2**-4 / sqrt(3)). Kernel and
#: reference agree to fp32 rounding, but quantising the activations turns a last-bit
#: difference at a rounding midpoint into a whole e4m3 step of that one value; such rare steps
#: stay far below one projection's quantisation noise, and a wrong kernel far above it.
FP8_STEP_NOISE = 2**-4 / 3**0.5


def _relative_rms(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(((a - b).double().square().mean() / b.double().square().mean()).sqrt())
