"""Fixtures for checkpoint-reader tests: independent float64 decoders and a checkpoint writer.

The reference decoders work from raw bytes and the published format definitions (model reference
§6.3) with numpy in float64, sharing no code with `deepinfer.models.quant`, so a test comparing
the two checks the format rather than our code against itself.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

# The 16 e2m1 values exactly as the model reference lists them (code order 0..15).
E2M1_TABLE = np.array(
    [0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=np.float64
)


def raw_bytes(t: torch.Tensor) -> np.ndarray:
    """The tensor's stored bytes as a uint8 array of the same shape (1-byte dtypes only)."""
    assert t.element_size() == 1
    return t.contiguous().view(torch.uint8).numpy().copy()


def e4m3_to_f64(b: np.ndarray) -> np.ndarray:
    """OCP FP8 e4m3 ("fn"): 1 sign, 4 exponent bits (bias 7), 3 mantissa bits, no infinities,
    S.1111.111 is NaN; exponent 0 is subnormal m/8 * 2**-6."""
    b = b.astype(np.int64)
    sign = np.where(b & 0x80, -1.0, 1.0)
    exp = (b >> 3) & 0xF
    man = (b & 0x7).astype(np.float64)
    mag = np.where(exp == 0, man / 8 * 2.0**-6, (1 + man / 8) * np.exp2((exp - 7).astype(float)))
    return np.where((b & 0x7F) == 0x7F, np.nan, sign * mag)


def ue8m0_to_f64(b: np.ndarray) -> np.ndarray:
    """OCP E8M0: 2**(b - 127); 0xFF is NaN."""
    b = b.astype(np.int64)
    return np.where(b == 255, np.nan, np.ldexp(1.0, b - 127))


def scale_to_f64(scale: torch.Tensor) -> np.ndarray:
    if scale.dtype.is_floating_point and scale.element_size() > 1:
        return scale.to(torch.float64).numpy()
    return ue8m0_to_f64(raw_bytes(scale))


def ref_fp8_block(weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int]) -> np.ndarray:
    """W[r, c] = e4m3(byte[r, c]) * S[r // bn, c // bk], element by element via index arrays."""
    values = e4m3_to_f64(raw_bytes(weight))
    s = scale_to_f64(scale)
    rows, cols = values.shape
    r_idx = np.arange(rows)[:, None] // block[0]
    c_idx = np.arange(cols)[None, :] // block[1]
    return values * s[r_idx, c_idx]


def ref_fp4(packed: torch.Tensor, scale: torch.Tensor, group: int = 32) -> np.ndarray:
    """Low nibble is element 2j, high nibble element 2j + 1; S per `group` values of a row."""
    b = raw_bytes(packed).astype(np.int64)
    rows, n = b.shape
    codes = np.empty((rows, 2 * n), dtype=np.int64)
    codes[:, 0::2] = b % 16
    codes[:, 1::2] = b // 16
    s = scale_to_f64(scale)
    return E2M1_TABLE[codes] * s[:, np.arange(2 * n) // group]


@dataclass
class Ref:
    """Namespace handed to tests through the `ref` fixture."""

    e2m1_table: np.ndarray
    raw_bytes: Callable[[torch.Tensor], np.ndarray]
    e4m3_to_f64: Callable[[np.ndarray], np.ndarray]
    ue8m0_to_f64: Callable[[np.ndarray], np.ndarray]
    fp8_block: Callable[..., np.ndarray]
    fp4: Callable[..., np.ndarray]


@pytest.fixture
def ref() -> Ref:
    return Ref(E2M1_TABLE, raw_bytes, e4m3_to_f64, ue8m0_to_f64, ref_fp8_block, ref_fp4)


WriteCheckpoint = Callable[..., Path]


def write_checkpoint(
    root: Path,
    shards: list[Mapping[str, torch.Tensor]],
    config: Mapping[str, object] | None = None,
    index: bool = True,
) -> Path:
    """Write tensors as safetensors shards plus an index (or one model.safetensors file)."""
    root.mkdir(parents=True, exist_ok=True)
    if not index:
        assert len(shards) == 1
        save_file(dict(shards[0]), str(root / "model.safetensors"))
    else:
        weight_map: dict[str, str] = {}
        for i, tensors in enumerate(shards):
            name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            save_file({k: v.contiguous() for k, v in tensors.items()}, str(root / name))
            weight_map.update(dict.fromkeys(tensors, name))
        (root / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {}, "weight_map": weight_map})
        )
    if config is not None:
        (root / "config.json").write_text(json.dumps(config))
    return root


@pytest.fixture
def checkpoint(tmp_path: Path) -> WriteCheckpoint:
    """`checkpoint(shards, config=None, index=True, name="ckpt")` writes under tmp_path."""

    def make(
        shards: list[Mapping[str, torch.Tensor]],
        config: Mapping[str, object] | None = None,
        index: bool = True,
        name: str = "ckpt",
    ) -> Path:
        return write_checkpoint(tmp_path / name, shards, config, index)

    return make
