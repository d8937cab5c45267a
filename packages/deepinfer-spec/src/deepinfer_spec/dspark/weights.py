"""DSpark drafter files: ``config.json`` (:class:`DSparkConfig`) and ``model.safetensors``
(the drafter's own weights; the target's embedding and head are not in it)."""

from __future__ import annotations

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


def save_drafter(drafter: DSparkDrafter, path: Path, dtype: torch.dtype = torch.bfloat16) -> None:
    """Write ``drafter`` to ``path`` (config.json, model.safetensors in ``dtype``)."""
    path.mkdir(parents=True, exist_ok=True)
    drafter.c.to_json(path / "config.json")
    state = {k: v.to(dtype).contiguous() for k, v in drafter.state_dict().items()}
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
    (path / "model.safetensors").chmod(0o644)  # a package asset, readable by everyone
