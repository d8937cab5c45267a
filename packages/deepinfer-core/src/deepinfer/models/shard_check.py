"""Safetensors shards checked before any weight is read, with errors that name the file.

safetensors itself answers a truncated, empty or foreign file with a bare ``SafetensorError``
("header too small", "incomplete metadata") that names no file, and only when that shard is
opened: a truncated last shard of a large checkpoint would fail after the shards before it had
loaded. :func:`read_shard_header` reads one header (one small read per shard) and checks it
against the file's size; :func:`check_listed_shards` does so for every shard of an index first.

The format: an 8-byte little-endian header length, a JSON header mapping each tensor name to its
``data_offsets`` within the data, then the data.
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from deepinfer.models.errors import CheckpointError

#: safetensors' own cap on the JSON header; a larger length field means the file is not one.
_MAX_HEADER_BYTES = 100_000_000
_LFS_POINTER = b"version https://git-lfs"


def _header_length(path: Path, size: int, start: bytes) -> int:
    """The header length that the file's first bytes (``start``) give, checked against ``size``."""
    if size == 0:
        raise CheckpointError(f"{path} is empty (0 bytes), not a safetensors file")
    if start == _LFS_POINTER:
        raise CheckpointError(
            f"{path} is a Git LFS pointer ({size} bytes), not the weights: fetch them with "
            "`git lfs pull`"
        )
    if size < 8:
        raise CheckpointError(
            f"{path} is truncated: {size} bytes, shorter than a safetensors header length field"
        )
    (n,) = struct.unpack("<Q", start[:8])
    if n > _MAX_HEADER_BYTES:
        raise CheckpointError(
            f"{path} is not a safetensors file: its first 8 bytes give a header of {n} bytes"
        )
    if n > size - 8:
        raise CheckpointError(
            f"{path} is truncated: {size} bytes, but its header alone needs {8 + n}"
        )
    return int(n)


def read_shard_header(path: Path) -> list[str]:
    """The tensor names of one safetensors file, after checking that the file is complete:
    the size its header describes (8 + header + the end of the last tensor) is its size."""
    try:
        with path.open("rb") as f:
            size = os.fstat(f.fileno()).st_size
            n = _header_length(path, size, f.read(len(_LFS_POINTER)))
            f.seek(8)
            raw = f.read(n)
    except OSError as exc:
        raise CheckpointError(f"cannot read shard {path}: {exc}") from exc
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path} is not a safetensors file: its header is not JSON") from exc
    if not isinstance(header, dict):
        raise CheckpointError(f"{path} is not a safetensors file: its header is not an object")
    names: list[str] = []
    data_end = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        offsets = info.get("data_offsets") if isinstance(info, dict) else None
        if not (
            isinstance(offsets, list)
            and len(offsets) == 2
            and all(isinstance(o, int) and o >= 0 for o in offsets)
        ):
            raise CheckpointError(
                f"{path} is not a valid safetensors file: tensor {name!r} has no data_offsets"
            )
        names.append(name)
        data_end = max(data_end, offsets[1])
    expected = 8 + n + data_end
    if size < expected:
        raise CheckpointError(
            f"{path} is truncated: {size} bytes, but its header describes {expected} "
            f"({expected - size} bytes missing)"
        )
    if size > expected:
        raise CheckpointError(
            f"{path} is corrupted: {size} bytes, {size - expected} more than its header "
            f"describes ({expected})"
        )
    return names


def check_listed_shards(root: Path, names_by_shard: Mapping[str, list[str]]) -> None:
    """Check every shard an index lists: present, complete, and holding the tensors the index
    places in it, all before the first weight is read."""
    for shard in names_by_shard:
        if not (root / shard).is_file():
            raise CheckpointError(f"shard {shard} listed in the index is missing from {root}")
    for shard, names in names_by_shard.items():
        present = set(read_shard_header(root / shard))
        absent = [n for n in names if n not in present]
        if absent:
            raise CheckpointError(
                f"index places {absent[0]} in shard {shard}, but that shard does not hold it"
                + (f" ({len(absent) - 1} more such tensors)" if len(absent) > 1 else "")
            )


@contextlib.contextmanager
def open_shard(path: Path) -> Iterator[Any]:
    """``safetensors.safe_open`` whose failures name the file (anything read_shard_header let
    through, such as an unknown dtype or overlapping tensors)."""
    from safetensors import SafetensorError, safe_open

    try:
        handle = safe_open(str(path), framework="pt", device="cpu")
    except (SafetensorError, OSError) as exc:
        raise CheckpointError(f"{path} is not a readable safetensors file: {exc}") from exc
    with handle:
        yield handle
