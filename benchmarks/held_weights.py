#!/usr/bin/env python3
"""Bytes the model holds for its weights: dequantised to bf16, and with ``quantization="auto"``
on a backend that computes on the stored formats, against ``deepinfer info --model``'s count
of the checkpoint's stored bytes. From config.json alone (the model is built on ``meta``), so
it runs anywhere in seconds.

    python benchmarks/held_weights.py [--out results/held_weights.json]
"""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path
from typing import Any

import torch
from _results import write_result

from deepinfer.config import ModelConfig
from deepinfer.model_info import model_report
from deepinfer.models import model_class
from deepinfer.models.checkpoint_config import read_config
from deepinfer.models.dummy_weights import weight_bytes

CONFIGS = Path(__file__).resolve().parents[1] / "examples" / "configs"
GIB = 2**30


def held(path: Path) -> dict[str, Any]:
    raw = read_config(path)
    cfg = ModelConfig.from_dict(raw)
    dequantised = weight_bytes(
        model_class(cfg.model_type)(cfg, dtype=torch.bfloat16, device="meta")
    )
    report = model_report(path)  # held: as stored on the stored-format kernels
    return {
        "held_bf16_gib": round(dequantised / GIB, 1),
        "held_as_stored_gib": round(report.held_bytes / GIB, 1),
        "info_stored_gib": round(report.stored_bytes / GIB, 1),
        "held_over_info": round(report.held_bytes / report.stored_bytes, 4),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    result = {
        "commit": commit,
        "note": "held_as_stored exceeds the stored bytes by what the model keeps wider than "
        "the checkpoint: fp32 router gates, compressor projections and LM head",
        "models": {p.name: held(p) for p in sorted(CONFIGS.iterdir()) if p.is_dir()},
    }
    for name, row in result["models"].items():
        print(name, row)
    write_result(result, args.out, "held_weights")


if __name__ == "__main__":
    main()
