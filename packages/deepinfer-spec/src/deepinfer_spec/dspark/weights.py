"""DSpark drafter files: ``config.json`` (:class:`DSparkConfig`) and ``model.safetensors``
(the drafter's own weights; the target's embedding and head are not in it), and where the
drafter was trained by ``tools/train_dspark.py``, ``train_log.json`` with its evaluation on
held-out text."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from deepinfer.models.causal_lm import DeepseekCausalLM
from deepinfer_spec.dspark.config import DSparkConfig
from deepinfer_spec.dspark.model import DSparkDrafter

#: the drafter trained for the embedded tiny model (``tools/train_dspark.py``)
SHIPPED = Path(__file__).resolve().parent.parent / "assets" / "tiny_dspark"


def load_drafter(path: Path, target: DeepseekCausalLM) -> DSparkDrafter:
    """The drafter at ``path`` for ``target``, on its device in its dtype; ValueError if it
    was built for another model."""
    config = DSparkConfig.from_json(path / "config.json")
    config.check_target(target.cfg)
    drafter = DSparkDrafter(config)
    drafter.load_state_dict(load_file(str(path / "model.safetensors")))
    return drafter.to(device=target.device, dtype=target.dtype).eval()


def load_acceptance(path: Path) -> dict[bool, list[float]] | None:
    """The acceptance per draft position (the share of rounds that kept position j) the
    drafter at ``path`` reached on held-out text when it was trained (``train_log.json``'s
    ``eval``): greedy (False) and at temperature 1 (True, for every sampled request); None
    where the directory records none."""
    try:
        log = json.loads((path / "train_log.json").read_text())
    except (OSError, ValueError):
        return None
    found = log.get("eval") if isinstance(log, dict) else None
    prior: dict[bool, list[float]] = {}
    for regime, name in ((False, "greedy"), (True, "temperature_1")):
        entry = found.get(name) if isinstance(found, dict) else None
        rates = entry.get("accept_rate_at_k") if isinstance(entry, dict) else None
        if (
            isinstance(rates, list)
            and rates
            and all(isinstance(r, int | float) and 0 <= r <= 1 for r in rates)
        ):
            prior[regime] = [float(r) for r in rates]
    return prior or None


def save_drafter(drafter: DSparkDrafter, path: Path, dtype: torch.dtype = torch.bfloat16) -> None:
    """Write ``drafter`` to ``path`` (config.json, model.safetensors in ``dtype``)."""
    path.mkdir(parents=True, exist_ok=True)
    drafter.c.to_json(path / "config.json")
    state = {k: v.to(dtype).contiguous() for k, v in drafter.state_dict().items()}
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
    (path / "model.safetensors").chmod(0o644)  # a package asset, readable by everyone
