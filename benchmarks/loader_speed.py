"""Throughput of `iter_checkpoint_tensors` on a synthetic multi-shard V4-style checkpoint.

Each shard mixes the three storage kinds of a real V4-Flash shard in roughly its proportions by
bytes: packed FP4 experts (most of the bytes), 128 x 128 block FP8 dense weights and BF16 tensors.
The shards are written first, so they are read from the page cache: the number measures the
reader and the dequantisation, not the disk.

    python benchmarks/loader_speed.py --shards 4 --shard-mib 256 --device cpu
    python benchmarks/loader_speed.py --device cuda --out benchmarks/results/loader_speed_cuda.json

Reports GB/s of bytes read from the shards and GB/s of dequantised tensors yielded.
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from deepinfer.models.loader import iter_checkpoint_tensors

MIB = 2**20
HIDDEN = 4096
EXPERT_INTER = 2048


def _fp8(rows: int, cols: int, gen: torch.Generator) -> torch.Tensor:
    return torch.randint(0, 0x7E, (rows, cols), generator=gen, dtype=torch.uint8).view(
        torch.float8_e4m3fn
    )


def _shard(index: int, shard_mib: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """About 75 % FP4 experts, 20 % FP8 dense, 5 % BF16, by bytes on disk."""
    t: dict[str, torch.Tensor] = {}
    budget = shard_mib * MIB
    expert_bytes = EXPERT_INTER * HIDDEN // 2  # one packed [I, d / 2] expert matrix
    e = 0
    while (e + 1) * expert_bytes <= 0.75 * budget:
        name = f"layers.{index}.ffn.experts.{e}.w1"
        t[f"{name}.weight"] = torch.randint(
            0, 256, (EXPERT_INTER, HIDDEN // 2), generator=gen, dtype=torch.uint8
        )
        t[f"{name}.scale"] = torch.randint(
            120, 130, (EXPERT_INTER, HIDDEN // 32), generator=gen, dtype=torch.uint8
        )
        e += 1
    dense_rows = max(128, int(0.2 * budget) // HIDDEN // 128 * 128)
    t[f"layers.{index}.attn.wq_b.weight"] = _fp8(dense_rows, HIDDEN, gen)
    t[f"layers.{index}.attn.wq_b.scale"] = torch.randint(
        120, 130, (dense_rows // 128, HIDDEN // 128), generator=gen, dtype=torch.uint8
    )
    bf16_rows = max(1, int(0.05 * budget) // (2 * HIDDEN))
    t[f"layers.{index}.ffn.gate.weight"] = torch.randn(bf16_rows, HIDDEN, generator=gen).to(
        torch.bfloat16
    )
    return t


def write_checkpoint(root: Path, shards: int, shard_mib: int) -> int:
    gen = torch.Generator().manual_seed(0)
    weight_map: dict[str, str] = {}
    for i in range(shards):
        name = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        tensors = _shard(i, shard_mib, gen)
        save_file(tensors, str(root / name))
        weight_map.update(dict.fromkeys(tensors, name))
    (root / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return sum(p.stat().st_size for p in root.glob("*.safetensors"))


def measure(root: Path, dtype: torch.dtype, device: str, repeats: int) -> list[dict[str, float]]:
    runs = []
    for _ in range(repeats):
        out_bytes = 0
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _name, tensor in iter_checkpoint_tensors(root, dtype=dtype, device=device):
            out_bytes += tensor.numel() * tensor.element_size()
            del tensor
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        runs.append({"seconds": time.perf_counter() - start, "out_bytes": out_bytes})
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--shard-mib", type=int, default=256)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/loader_speed.json"))
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)

    with tempfile.TemporaryDirectory(prefix="loader-speed-") as tmp:
        root = Path(tmp)
        disk_bytes = write_checkpoint(root, args.shards, args.shard_mib)
        measure(root, dtype, args.device, 1)  # warm-up: page cache, lazy imports, CUDA context
        runs = measure(root, dtype, args.device, args.repeats)

    best = min(runs, key=lambda r: r["seconds"])
    result = {
        "benchmark": "loader_speed",
        "device": args.device,
        "device_name": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
        "cpu_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "dtype": args.dtype,
        "shards": args.shards,
        "disk_bytes": disk_bytes,
        "out_bytes": best["out_bytes"],
        "seconds_best": best["seconds"],
        "seconds_all": [r["seconds"] for r in runs],
        "read_gb_per_s": disk_bytes / best["seconds"] / 1e9,
        "dequantised_gb_per_s": best["out_bytes"] / best["seconds"] / 1e9,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
