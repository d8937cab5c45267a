"""Peak memory of iter_checkpoint_tensors stays near one shard, not the whole checkpoint.

The load runs in a fresh subprocess so its high-water mark reflects only this load (torch, pytest
and earlier tests would otherwise set it). The peak is read from VmHWM in /proc/self/status, not
from ru_maxrss: Linux carries ru_maxrss across exec, so a child forked from a large pytest process
starts with the parent's high-water mark, whereas VmHWM belongs to the new address space. The
peak is compared with the resident size after imports, so it only counts the load.

The load is measured twice. Once with glibc's mmap threshold pinned at 1 MiB, so every large
tensor is returned to the OS when freed and the number reflects only what the loader holds.
Once with the default allocator, where glibc raises the threshold after the first large free and
serves later tensors from a heap whose freed pages it may keep; the loader's `malloc_trim` calls
bound that, and the test checks the bound.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

N_SHARDS = 6
MIB = 2**20

PROBE = r"""
import json, sys
import torch, safetensors, tqdm.auto  # imported before the baseline is taken
from deepinfer.models.loader import iter_checkpoint_tensors

def status_mib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024  # kB
    raise KeyError(field)

def rss_mib():
    return status_mib("VmRSS")

before = rss_mib()
hwm_before = status_mib("VmHWM")
count, out_bytes, largest = 0, 0, 0
for name, tensor in iter_checkpoint_tensors(sys.argv[1], dtype=torch.bfloat16, progress=False):
    count += 1
    nbytes = tensor.numel() * tensor.element_size()
    out_bytes += nbytes
    largest = max(largest, nbytes)
    del tensor
peak = status_mib("VmHWM")
print(json.dumps({"before": before, "peak": peak, "hwm_before": hwm_before, "after": rss_mib(),
                  "count": count, "out_bytes": out_bytes, "largest": largest}))
"""


def _random_fp8(rows: int, cols: int, gen: torch.Generator) -> torch.Tensor:
    raw = torch.randint(0, 0x7E, (rows, cols), generator=gen, dtype=torch.uint8)  # no NaN codes
    return raw.view(torch.float8_e4m3fn)


def _write_shards(checkpoint) -> tuple[Path, int]:
    gen = torch.Generator().manual_seed(0)
    shards = []
    for i in range(N_SHARDS):
        shards.append(
            {
                f"layers.{i}.attn.wq_b.weight": _random_fp8(4096, 4096, gen),  # 16 MiB
                f"layers.{i}.attn.wq_b.scale": torch.full((32, 32), 120, dtype=torch.uint8),
                f"layers.{i}.ffn.experts.0.w1.weight": torch.randint(
                    0, 256, (4096, 2048), generator=gen, dtype=torch.uint8
                ),  # 8 MiB packed FP4
                f"layers.{i}.ffn.experts.0.w1.scale": torch.full((4096, 128), 126).to(torch.uint8),
                f"layers.{i}.ffn.shared_experts.w2.weight": torch.randn(
                    2048, 4096, generator=gen
                ).to(torch.bfloat16),  # 16 MiB
            }
        )
    root = checkpoint(shards)
    return root, max(p.stat().st_size for p in root.glob("*.safetensors"))


def _probe(root: Path, pin_mmap_threshold: bool) -> dict[str, float]:
    env = dict(os.environ)
    if pin_mmap_threshold:
        env["MALLOC_MMAP_THRESHOLD_"] = str(1 * MIB)
    else:
        env.pop("MALLOC_MMAP_THRESHOLD_", None)
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, str(root)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_peak_rss_stays_near_one_shard(checkpoint) -> None:
    root, shard_bytes = _write_shards(checkpoint)
    total_bytes = sum(p.stat().st_size for p in root.glob("*.safetensors"))
    shard_mib, total_mib = shard_bytes / MIB, total_bytes / MIB

    pinned = _probe(root, pin_mmap_threshold=True)
    assert pinned["count"] == 3 * N_SHARDS
    largest_mib = pinned["largest"] / MIB  # the bf16 output of one 4096 x 4096 weight
    out_mib = pinned["out_bytes"] / MIB
    rise = pinned["peak"] - pinned["before"]
    # One shard's pages + one yielded tensor + the 16 MiB fp32 dequantisation chunk; the slack
    # covers the chunk's int32 gather index (16 MiB at most) and small allocations.
    budget = shard_mib + largest_mib + 16 + 24
    report = (
        f"shard {shard_mib:.0f} MiB x {N_SHARDS} = {total_mib:.0f} MiB on disk, "
        f"{out_mib:.0f} MiB yielded; peak rise {rise:.0f} MiB (budget {budget:.0f})"
    )
    print(report)
    assert rise < budget, report
    assert rise < 0.5 * total_mib, report
    # Nothing is retained once iteration ends.
    assert pinned["after"] - pinned["before"] < 16, pinned

    default = _probe(root, pin_mmap_threshold=False)
    default_rise = default["peak"] - default["before"]
    print(f"default allocator: peak rise {default_rise:.0f} MiB")
    assert default_rise < 0.75 * total_mib, default
