"""Decode step with and without the sm100 backend's kernels, side by side in one process.

For the random-weight V4 tiny model and the embedded V4.1 tiny model (fp32 and bf16), at
B = 1, 32, 128 sequences that each prefilled 64 tokens, the step time of ``forward_decode`` under
three op tables:

* ``reference``: the torch reference backend (every op plain torch);
* ``mhc``: the reference plus the fused mHC-weights kernel (gates + Sinkhorn);
* ``all``: the sm100 backend as shipped (mHC weights, mixer, exit, RMSNorm, RoPE kernels).

A compressed layer does extra work on the steps that close a window, so each variant times a
block of 16 consecutive steps (every phase of the ratio-4 and ratio-16 compressors) and reports
the mean step of the block; blocks of the variants alternate, and the median of ``--repeats``
blocks is reported. Needs an NVIDIA GPU. Results: ``benchmarks/results/kernel_ab_<gpu>.json``.

    python benchmarks/kernel_ab.py [--repeats 3] [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from _results import write_result

from deepinfer.assets import random_tiny_model, tiny_model
from deepinfer.backends.base import Backend
from deepinfer.backends.torch_ref import TorchBackend
from deepinfer.models.batch import ForwardBatch
from deepinfer.models.deepseek_v4 import DeepseekV4ForCausalLM
from deepinfer.models.state import ModelState
from deepinfer_kernels_sm100.backend import Sm100Backend


class MhcOnly(TorchBackend):
    """The reference with only the fused mHC-weights kernel."""

    mhc_weights = Sm100Backend.mhc_weights


def block_ms(
    m: DeepseekV4ForCausalLM, ids: torch.Tensor, states: list[ModelState], steps: int = 16
) -> float:
    m(ForwardBatch.decode(ids, states))
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        m(ForwardBatch.decode(ids, states))
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / steps * 1e3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 32, 128])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    tables: dict[str, Backend] = {
        "reference": TorchBackend("cuda"),
        "mhc": MhcOnly("cuda"),
        "all": Sm100Backend("cuda"),
    }
    builders: dict[str, Callable[[torch.dtype], DeepseekV4ForCausalLM]] = {
        "v4": lambda dt: random_tiny_model(dt, device="cuda", seed=3),
        "v41": lambda dt: tiny_model(dt, device="cuda"),
    }
    rows = []
    for name, build in builders.items():
        for dt in (torch.float32, torch.bfloat16):
            m = build(dt)
            top = min(m.cfg.vocab_size, m.cfg.image_token_id or m.cfg.vocab_size)
            for b in args.batches:
                g = torch.Generator().manual_seed(b)
                states = [m.new_state(1) for _ in range(b)]
                prompts = [torch.randint(3, top, (64,), generator=g).cuda() for _ in range(b)]
                m(ForwardBatch.build(prompts, states))
                ids = torch.randint(3, top, (b,), generator=g).cuda()
                times: dict[str, list[float]] = {k: [] for k in tables}
                for _ in range(args.repeats):
                    for key, ops in tables.items():
                        m.ops = ops
                        times[key].append(block_ms(m, ids, states))
                row = {"model": name, "dtype": str(dt).removeprefix("torch."), "batch": b}
                row |= {f"{k}_step_ms": round(statistics.median(v), 2) for k, v in times.items()}
                row["speedup_all_vs_reference"] = round(
                    row["reference_step_ms"] / row["all_step_ms"], 2
                )
                print(json.dumps(row), flush=True)
                rows.append(row)
    result = {
        "benchmark": "kernel_ab",
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "rows": rows,
    }
    gpu = torch.cuda.get_device_name(0).split()[-1].lower()
    write_result(result, args.out, f"kernel_ab_{gpu}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
