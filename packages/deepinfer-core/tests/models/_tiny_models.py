"""The two engine-scale models the batching and rollback tests drive, and text ids for them."""

from __future__ import annotations

import torch

from deepinfer.assets import TINY_DIR, random_tiny_model, tiny_model
from deepinfer.models.deepseek_v4 import DeepseekV4ForCausalLM


def tiny_models(seed: int) -> list[tuple[str, DeepseekV4ForCausalLM]]:
    """The random-weight V4 tiny model and, when embedded, the trained V4.1 one (fp32)."""
    models = [("v4", random_tiny_model(torch.float32, seed=seed))]
    if (TINY_DIR / "model.safetensors").is_file():
        models.append(("v41", tiny_model(torch.float32)))
    return models


def text_ids(model: DeepseekV4ForCausalLM, gen: torch.Generator, n: int) -> torch.Tensor:
    """Random ids below the image placeholder (which needs embeddings these tests lack)."""
    top = model.cfg.vocab_size
    if model.cfg.image_token_id is not None:
        top = min(top, model.cfg.image_token_id)
    return torch.randint(3, top, (n,), generator=gen)
