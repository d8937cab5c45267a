"""The tiny V4 and V4.1 models with every sm100 kernel in place give the reference's logits.

Off the GPU the backend cannot be constructed (no CUDA), so its op table is bound to the CPU
directly and the kernels run in Triton's interpreter.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from deepinfer.assets import random_tiny_model, tiny_model
from deepinfer.models.batch import ForwardBatch
from deepinfer.models.deepseek_v4 import DeepseekV4ForCausalLM
from deepinfer_kernels_sm100.backend import Sm100Backend

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _kernel_ops() -> Sm100Backend:
    ops = object.__new__(Sm100Backend)  # skip the availability check: no GPU here
    ops.device = torch.device(DEVICE)
    return ops


BUILDERS: dict[str, Callable[[], DeepseekV4ForCausalLM]] = {
    "v4": lambda: random_tiny_model(device=DEVICE, seed=3),
    "v41": lambda: tiny_model(device=DEVICE),
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
        torch.testing.assert_close(a, b, atol=2e-4, rtol=2e-4)
