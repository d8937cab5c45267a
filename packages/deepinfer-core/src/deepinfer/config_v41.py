"""DeepSeek-V4.1's config.json: the nested layout, and the layer-group wiring checked once.

V4.1 nests the text model's fields under ``text_config`` next to a ``vision_config`` and a few
top-level keys. :class:`~deepinfer.config.ModelConfig` holds them flattened; this module maps
between the two layouts and checks the KV/index-source wiring that only V4.1 has.
"""

from __future__ import annotations

from dataclasses import fields
from typing import TYPE_CHECKING, Any

from deepinfer.config_types import V41_TYPE, ConfigError, UnsupportedConfigError

if TYPE_CHECKING:
    from deepinfer.config import ModelConfig

#: Top-level keys of a V4.1 config.json that belong to the text model's fields.
V41_OUTER_FIELDS = (
    "quantization_config",
    "image_token_id",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "vision_config",
    "tie_word_embeddings",
)

#: What V4.1 switches on when its text_config does not say (SGLang's runtime flags for V4.1).
V41_DEFAULTS: dict[str, Any] = {
    "num_hash_layers": 0,  # no tid2eid tables in V4.1
    "hc_pre_from_prev_sublayer": True,
    "q_head_norm": False,
    "moe_image_bias": True,
}


def v41_kwargs(raw: dict[str, Any], names: set[str]) -> dict[str, Any]:
    model_type = raw.pop("model_type", V41_TYPE)
    if not str(model_type).startswith(V41_TYPE):
        raise ConfigError(f"model_type={model_type!r} with a text_config is not DeepSeek-V4.1")
    text = raw.pop("text_config", None)
    if text is None:  # an already flattened V4.1 text config
        text, raw = raw, {}
    if not isinstance(text, dict):
        raise ConfigError(f"text_config must be an object, got {type(text).__name__}")
    text = dict(text)
    text.pop("model_type", None)
    names = names - {"attn_kinds", "extra", "outer_extra", "model_type"}
    kwargs: dict[str, Any] = dict(V41_DEFAULTS)
    kwargs.update({k: text.pop(k) for k in list(text) if k in names})
    if "dtype" in text and "torch_dtype" not in kwargs:
        kwargs["torch_dtype"] = text.pop("dtype")
    for key in V41_OUTER_FIELDS:
        if key in raw:
            kwargs[key] = raw.pop(key)
    if "dtype" in raw:
        kwargs["torch_dtype"] = raw.pop("dtype")
    kwargs["model_type"] = V41_TYPE
    kwargs["extra"] = text
    kwargs["outer_extra"] = raw
    return kwargs


def v41_to_dict(cfg: ModelConfig) -> dict[str, Any]:
    text: dict[str, Any] = {"model_type": f"{V41_TYPE}_text", **cfg.extra}
    out: dict[str, Any] = {
        "architectures": ["DeepseekV41ForCausalLM"],
        **cfg.outer_extra,
        "model_type": V41_TYPE,
    }
    skip = {"attn_kinds", "extra", "outer_extra", "model_type", "expert_dtype", "torch_dtype"}
    for f in fields(cfg):
        if f.name in skip:
            continue
        value = getattr(cfg, f.name)
        if f.name in V41_OUTER_FIELDS:
            if value is not None:
                out[f.name] = value
        else:
            text[f.name] = value
    out["dtype"] = cfg.torch_dtype
    if cfg.expert_dtype is not None:
        text["expert_dtype"] = cfg.expert_dtype
    out["text_config"] = text
    return out


def validate_v41(cfg: ModelConfig) -> None:
    """Check the layer-group wiring once, so the model can follow it without re-checking."""
    n = cfg.num_hidden_layers
    for name in ("kv_source_layer_ids", "index_source_layer_ids", "engram_layer_ids"):
        ids = getattr(cfg, name)
        if sorted(set(ids)) != list(ids) or any(not 0 <= i < n for i in ids):
            raise ConfigError(f"{name}={ids} must be increasing layer ids below {n}")
    for layer in range(n):
        ratio = cfg.compress_ratios[layer]
        if ratio == 0:
            if layer in cfg.kv_source_layer_ids or layer in cfg.index_source_layer_ids:
                raise ConfigError(f"layer {layer} has compress ratio 0 but is a KV/index source")
            continue
        if ratio not in (1, 2):
            raise UnsupportedConfigError(
                f"compress ratio {ratio} at layer {layer}: V4.1 compressors have ratio 1 or 2"
            )
        kv_src = cfg.kv_source_of(layer)
        idx_src = cfg.index_source_of(layer)
        if kv_src is None or cfg.compress_ratios[kv_src] != ratio:
            raise ConfigError(
                f"layer {layer} (ratio {ratio}) has no KV-source layer of the same ratio at or "
                f"before it in kv_source_layer_ids={cfg.kv_source_layer_ids}"
            )
        if idx_src is None or idx_src < kv_src:
            raise ConfigError(
                f"layer {layer} reads layer {kv_src}'s entries but no index source at or after "
                f"{kv_src} precedes it (index_source_layer_ids={cfg.index_source_layer_ids})"
            )
    cand = cfg.candidate_source_layer_id
    if cand is not None:
        if cand not in cfg.index_source_layer_ids:
            raise ConfigError(f"candidate_source_layer_id={cand} is not an index source")
        if cfg.candidate_topk_blocks < 1 or cfg.candidate_block_size < 1:
            raise ConfigError("candidate_topk_blocks and candidate_block_size must be >= 1")
    if cfg.engram_layer_ids:
        if cfg.engram_max_ngram_size < 2 or cfg.engram_n_heads < 1 or cfg.engram_head_dim < 1:
            raise ConfigError("Engram needs engram_max_ngram_size >= 2, heads and head_dim >= 1")
        if cfg.engram_compressed_vocab_size < 1:
            raise ConfigError("Engram needs engram_compressed_vocab_size >= 1")
