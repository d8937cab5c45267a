"""Damaged safetensors files are reported by name, with what is wrong, before anything loads.

Each case damages a file the way downloads and copies do (cut short, emptied, replaced by an
error page or a Git LFS pointer, padded) and checks the error against facts of the file itself:
its path, and the byte counts read from its header with ``struct`` and ``json`` (the format is
an 8-byte little-endian header length, a JSON header, then the data).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from deepinfer.errors import DeepInferError
from deepinfer.models import load_model
from deepinfer.models.loader import iter_checkpoint_tensors

LFS_POINTER = (
    b"version https://git-lfs.github.com/spec/v1\n"
    b"oid sha256:4d7a214614ab2935c943f9e0ff69d22eadbb8f32b1258daaa5e2ca24d17e2393\n"
    b"size 13761276\n"
)


def _declared_size(data: bytes) -> int:
    """The file size a safetensors header describes: 8 + header + the end of the last tensor."""
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    return 8 + n + max(v["data_offsets"][1] for k, v in header.items() if k != "__metadata__")


def _tensors(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"norm.weight": torch.randn(64, generator=g), "head.weight": torch.randn(8, 64)}


#: name -> (how to damage the bytes, words the error must contain)
DAMAGE: dict[str, tuple[Callable[[bytes], bytes], tuple[str, ...]]] = {
    "empty": (lambda d: b"", ("empty", "0 bytes")),
    "cut-in-length": (lambda d: d[:5], ("truncated", "5 bytes")),
    "cut-in-header": (lambda d: d[:40], ("truncated", "40 bytes")),
    "cut-in-data": (lambda d: d[:-100], ("truncated", "100 bytes missing")),
    "padded": (lambda d: d + b"\0" * 7, ("corrupted", "7 more")),
    "html-page": (lambda d: b"<!DOCTYPE html><html>404 Not Found</html>", ("not a safetensors",)),
    "lfs-pointer": (lambda d: LFS_POINTER, ("Git LFS pointer", "git lfs pull")),
    "header-not-json": (lambda d: d[:8] + b"\xff" * (len(d) - 8), ("header is not JSON",)),
}


def _damage(path: Path, case: str) -> None:
    data = path.read_bytes()
    assert _declared_size(data) == len(data)  # intact before
    path.write_bytes(DAMAGE[case][0](data))


@pytest.mark.parametrize("case", list(DAMAGE))
def test_single_file_checkpoint(tmp_path: Path, case: str) -> None:
    file = tmp_path / "model.safetensors"
    save_file(_tensors(0), str(file))
    _damage(file, case)
    for load in (
        lambda: list(iter_checkpoint_tensors(tmp_path, progress=False)),
        lambda: list(iter_checkpoint_tensors(file, progress=False)),
    ):
        with pytest.raises(DeepInferError) as info:
            load()
        message = str(info.value)
        assert str(file) in message
        for words in DAMAGE[case][1]:
            assert words in message


@pytest.mark.parametrize("case", list(DAMAGE))
def test_every_shard_of_an_index_is_checked_before_loading(tmp_path: Path, case: str) -> None:
    """A damaged last shard fails at once, before the first shard's tensors are handed out."""
    shards = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    weight_map: dict[str, str] = {}
    for i, shard in enumerate(shards):
        tensors = {f"layers.{i}.{k}": v for k, v in _tensors(i).items()}
        save_file(tensors, str(tmp_path / shard))
        weight_map.update(dict.fromkeys(tensors, shard))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    _damage(tmp_path / shards[1], case)
    stream = iter_checkpoint_tensors(tmp_path, progress=False)
    with pytest.raises(DeepInferError) as info:
        next(stream)
    message = str(info.value)
    assert shards[1] in message and shards[0] not in message
    for words in DAMAGE[case][1]:
        assert words in message


def test_header_that_safetensors_rejects_names_the_file(tmp_path: Path) -> None:
    """Damage the size checks cannot see (an unknown dtype) still names the file."""
    file = tmp_path / "model.safetensors"
    save_file(_tensors(0), str(file))
    data = file.read_bytes()
    assert data.count(b'"F32"') == 2
    file.write_bytes(data.replace(b'"F32"', b'"Q99"'))  # same length: offsets still add up
    with pytest.raises(DeepInferError, match="not a readable safetensors file") as info:
        list(iter_checkpoint_tensors(tmp_path, progress=False))
    assert str(file) in str(info.value)


def test_load_model_reports_a_truncated_checkpoint(tmp_path: Path) -> None:
    """The public entry point: a config.json beside a truncated file."""
    from deepinfer.assets import TINY_DIR

    (tmp_path / "config.json").write_text((TINY_DIR / "config.json").read_text())
    file = tmp_path / "model.safetensors"
    save_file(_tensors(0), str(file))
    _damage(file, "cut-in-data")
    with pytest.raises(DeepInferError, match="truncated") as info:
        load_model(tmp_path, dtype=torch.float32)
    assert str(file) in str(info.value)
