"""A quantised checkpoint loads into the model and computes what float64-dequantised weights do.

The tiny model's projections are stored as FP8 e4m3 blocks (ue8m0 and fp32 scales) and its
routed experts as packed FP4 e2m1 with ue8m0 group scales, as in the published checkpoints.
The reference dequantises the stored bytes with the independent float64 decoders of conftest and
computes with those weights; the loader path must give the same logits.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import torch

from deepinfer.assets import random_tiny_model, tiny_config
from deepinfer.models import load_model
from deepinfer.models.quant import quant_fp4_e2m1, quant_fp8_block

FP8 = re.compile(r"attn\.(wq_a|wq_b|wkv|wo_a|wo_b)\.weight$|shared_experts\.w[123]\.weight$")
FP4 = re.compile(r"ffn\.experts\.\d+\.w[123]\.weight$")
BLOCK = (32, 32)


@pytest.mark.parametrize("scale_fmt", ["ue8m0", "fp32"])
def test_quantised_checkpoint_matches_float64_dequantised_weights(
    checkpoint: Any, ref: Any, scale_fmt: str
) -> None:
    torch.manual_seed(0)
    source = random_tiny_model(torch.float32, seed=3)
    stored: dict[str, torch.Tensor] = {}
    dequantised: dict[str, torch.Tensor] = {}
    n_fp8 = n_fp4 = 0
    for name, tensor in source.state_dict().items():
        if FP8.search(name):
            q, s = quant_fp8_block(tensor, BLOCK, scale_fmt)  # type: ignore[arg-type]
            stored[name], stored[name.replace(".weight", ".scale")] = q, s
            dequantised[name] = torch.from_numpy(ref.fp8_block(q, s, BLOCK)).float()
            n_fp8 += 1
        elif FP4.search(name):
            q, s = quant_fp4_e2m1(tensor)
            stored[name], stored[name.replace(".weight", ".scale")] = q, s
            dequantised[name] = torch.from_numpy(ref.fp4(q, s)).float()
            n_fp4 += 1
        else:
            stored[name] = tensor
            dequantised[name] = tensor
    assert n_fp8 >= 5 * 4 and n_fp4 >= 3 * 8 * 4
    config = tiny_config().to_dict() | {
        "quantization_config": {
            "quant_method": "fp8",
            "fmt": "e4m3",
            "scale_fmt": scale_fmt,
            "weight_block_size": list(BLOCK),
        },
        "expert_dtype": "fp4",
    }
    names = sorted(stored)
    half = len(names) // 2  # two shards, streamed one after the other
    path = checkpoint(
        [{k: stored[k] for k in names[:half]}, {k: stored[k] for k in names[half:]}], config
    )
    model = load_model(path, dtype=torch.float32)

    reference = random_tiny_model(torch.float32, seed=3)
    reference.load_state(dequantised.items())
    ids = torch.randint(3, 8000, (2, 150), generator=torch.Generator().manual_seed(1))
    got = model.forward_logits(ids)
    want = reference.forward_logits(ids)
    assert (got - want).abs().max().item() <= 1e-5
    # The quantisation is real: the original weights give visibly different logits.
    assert (source.forward_logits(ids) - want).abs().max().item() > 1e-3
