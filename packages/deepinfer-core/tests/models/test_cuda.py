"""The model on a CUDA device (plain torch ops) against transformers on the CPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from _v4_oracle import build_hf, load_export_tool

from deepinfer.models import load_model

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def test_cuda_fp32_matches_transformers_and_bf16_runs(tmp_path: Path) -> None:
    hf = build_hf(0)
    load_export_tool().export_model(hf, tmp_path)
    ids = torch.randint(
        0, hf.config.vocab_size, (2, 90), generator=torch.Generator().manual_seed(1)
    )
    with torch.no_grad():
        ref = hf(ids).logits
    model = load_model(tmp_path, dtype=torch.float32, device="cuda")
    full = model.forward_logits(ids.cuda()).cpu()
    assert (full - ref).abs().max().item() < 1e-4
    state = model.new_state(2)
    chunks = [model.step(ids[:, :41].cuda(), state)]
    chunks += [model.step(ids[:, t : t + 1].cuda(), state) for t in range(41, 90)]
    assert (torch.cat(chunks, dim=1).cpu() - ref).abs().max().item() < 1e-4

    bf16 = load_model(tmp_path, dtype=torch.bfloat16, device="cuda")
    out = bf16.forward_logits(ids.cuda()).cpu()
    assert out.dtype == torch.float32 and torch.isfinite(out).all()
    assert (out.argmax(-1) == ref.argmax(-1)).float().mean().item() > 0.8
