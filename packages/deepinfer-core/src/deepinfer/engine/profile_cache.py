"""The adaptive schedule's start-up profile, kept on disk between engines.

Profiling a model's plain and verification steps and its drafter's rounds
(:mod:`.verify_profile`, :mod:`.draft_cost`) takes seconds: on a CPU, most of the embedded
model's start-up with speculation on. What it measures depends only on what its key holds: the
machine (device name, CPU threads), the software (DeepInfer's and torch's versions), the model's
shape (its config, dtype and backend, not its weights) and the profile's own inputs (draft
length, rows, feature layers, CUDA graphs, the drafter's own key). So the tables are saved as
JSON under ``$DEEPINFER_CACHE/profiles`` (``~/.cache/deepinfer/profiles`` by default), named by
the key's hash, and the next engine with the same key reads them instead of profiling. Delete
the folder to profile afresh. A file that cannot be read is profiled again and one that cannot
be written is not kept: the cache never fails an engine.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import platform
import tempfile
from pathlib import Path
from typing import Any

import torch

from deepinfer.__about__ import __version__
from deepinfer.engine.verify_cost import StepCost, VerifyCost
from deepinfer.models.causal_lm import DeepseekCausalLM

logger = logging.getLogger(__name__)

#: Bumped when the saved layout (or what a profile measures) changes.
FORMAT = 2


def cache_dir() -> Path:
    """Where profiles are kept: ``$DEEPINFER_CACHE/profiles`` or the user's cache folder."""
    root = os.environ.get("DEEPINFER_CACHE") or Path.home() / ".cache" / "deepinfer"
    return Path(root) / "profiles"


def device_name(device: torch.device) -> str:
    """The device a profile was timed on: the GPU's name, or the CPU's model, core count and
    torch's thread count (a profile taken at one thread prices nothing at two)."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{_cpu_model()} x{os.cpu_count()} threads={torch.get_num_threads()}"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def profile_key(
    model: DeepseekCausalLM, drafter_key: str, max_num_seqs: int, cuda_graphs: bool, k: int
) -> str:
    """The hash naming a profile of ``model`` with a drafter described by ``drafter_key``
    (see the module for what goes in)."""
    fields = {
        "format": FORMAT,
        "deepinfer": __version__,
        "torch": torch.__version__,
        "device": device_name(model.device),
        "model": dataclasses.asdict(model.cfg),
        "dtype": str(model.dtype),
        "backend": f"{type(model.ops).__module__}.{type(model.ops).__qualname__}",
        "drafter": drafter_key,
        "max_num_seqs": max_num_seqs,
        "cuda_graphs": cuda_graphs,
        "k": k,
    }
    text = json.dumps(fields, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def read(key: str) -> tuple[StepCost, VerifyCost | None] | None:
    """The profile saved under ``key`` (None: none, or one that does not read back)."""
    path = cache_dir() / f"{key}.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("format") != FORMAT:
            return None
        cost = StepCost(
            _curve(data["plain"]),
            tuple(_curve(c) for c in data["verify"]),
            tuple(data["rows"]),
            None if data["draws"] is None else _curve(data["draws"]),
        )
        drafting = None if data["drafting"] is None else _curve(data["drafting"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        if not isinstance(exc, FileNotFoundError):
            logger.warning("speculation: profile %s unreadable (%s); profiling again", path, exc)
        return None
    logger.info("speculation: step costs read from %s", path)
    return cost, drafting


def write(key: str, cost: StepCost, drafting: VerifyCost | None) -> None:
    """Save a profile under ``key`` (atomically: readers see the whole file or none)."""
    data: dict[str, Any] = {
        "format": FORMAT,
        "plain": _table(cost.plain),
        "verify": [_table(c) for c in cost.verify],
        "rows": list(cost.rows),
        "draws": None if cost.draws is None else _table(cost.draws),
        "drafting": None if drafting is None else _table(drafting),
    }
    folder = cache_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=folder, suffix=".tmp", delete=False) as f:
            json.dump(data, f)
        os.replace(f.name, folder / f"{key}.json")
    except OSError as exc:
        logger.warning("speculation: profile not kept in %s (%s)", folder, exc)


def _table(curve: VerifyCost) -> list[list[float]]:
    return [[n, s] for n, s in zip(curve.tokens, curve.seconds, strict=True)]


def _curve(pairs: list[list[float]]) -> VerifyCost:
    return VerifyCost.from_table({int(n): float(s) for n, s in pairs})
