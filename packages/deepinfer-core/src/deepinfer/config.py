"""Model configuration parsed from a checkpoint's ``config.json`` as DeepSeek publishes it.

The published V4 files describe the attention schedule with ``compress_ratios`` (one entry per
layer, then one per MTP layer) and the hash-routed layers with ``num_hash_layers``. We keep those
raw fields as the source of truth and derive per-layer attention kinds from them, so a config with
any ratio (for example a tiny test model with HCA ratio 16) loads without a lookup table.

V4.1 (``model_type: deepseek_v41``) nests the text model's fields under ``text_config`` next to a
``vision_config`` and a top-level ``quantization_config``. We flatten the text fields into the same
dataclass (V4.1-only fields default to "off", so V4 configs parse exactly as before) and keep the
outer keys so :meth:`ModelConfig.to_dict` writes the nested layout back
(:mod:`deepinfer.config_v41`).

Every field is checked against its annotation (and sizes against their ranges) when the config
is built (:mod:`deepinfer.config_types`), so a hand-edited or foreign config.json fails with a
ConfigError naming the field instead of a TypeError deep inside the model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

from deepinfer.config_types import (
    V41_TYPE,
    ConfigError,
    UnsupportedConfigError,
    check_field_types,
    str_list,
)

AttnKind = Literal["swa", "csa", "hca", "sparse"]

#: model_type of the V4 family; V4.1's is V41_TYPE (:mod:`deepinfer.config_v41` reads it).
V4_TYPE = "deepseek_v4"

#: The ratio the official code treats as "overlapping compressor + lightning indexer" (CSA).
CSA_RATIO = 4

_HF_LAYER_TYPES: dict[str, AttnKind] = {
    "sliding_attention": "swa",
    "compressed_sparse_attention": "csa",
    "heavily_compressed_attention": "hca",
}


@dataclass
class ModelConfig:
    """DeepSeek-V4 hyper-parameters, named as in the published ``config.json``."""

    model_type: str = "deepseek_v4"
    vocab_size: int = 129280
    hidden_size: int = 4096
    num_hidden_layers: int = 43
    num_attention_heads: int = 64
    num_key_value_heads: int = 1
    head_dim: int = 512
    qk_rope_head_dim: int = 64
    q_lora_rank: int = 1024
    o_groups: int = 8
    o_lora_rank: int = 1024
    moe_intermediate_size: int = 2048
    n_routed_experts: int = 256
    n_shared_experts: int = 1
    num_experts_per_tok: int = 6
    scoring_func: str = "sqrtsoftplus"
    topk_method: str = "noaux_tc"
    norm_topk_prob: bool = True
    routed_scaling_factor: float = 1.5
    num_hash_layers: int = 3
    swiglu_limit: float = 10.0
    hidden_act: str = "silu"
    sliding_window: int = 128
    #: One ratio per main layer followed by one per MTP layer (0 = sliding window only).
    compress_ratios: list[int] = field(default_factory=list)
    index_n_heads: int = 64
    index_head_dim: int = 128
    index_topk: int = 512
    hc_mult: int = 4
    hc_sinkhorn_iters: int = 20
    hc_eps: float = 1e-6
    rope_theta: float = 10000.0
    compress_rope_theta: float = 160000.0
    rope_scaling: dict[str, Any] | None = None
    max_position_embeddings: int = 1048576
    rms_norm_eps: float = 1e-6
    num_nextn_predict_layers: int = 1
    tie_word_embeddings: bool = False
    bos_token_id: int | None = 0
    eos_token_id: int | list[int] | None = 1
    torch_dtype: str = "bfloat16"
    #: Kept verbatim for the checkpoint reader (FP8 block sizes, scale format, expert dtype).
    quantization_config: dict[str, Any] | None = None
    expert_dtype: str | None = None
    #: Per-layer attention kind, derived from ``compress_ratios`` (main layers, then MTP layers).
    attn_kinds: list[AttnKind] = field(default_factory=list)
    #: Every key of config.json we did not map to a field, so nothing is silently lost.
    extra: dict[str, Any] = field(default_factory=dict)

    # -- V4.1 only (defaults switch every V4.1 feature off; V4 configs never set these) ---------
    # Keep these last: V41_FIELDS is every field from kv_source_layer_ids on.
    #: Layers that own a ratio-1/2 compressor; every later compressed layer reads the entries of
    #: the latest source at or before it.
    kv_source_layer_ids: list[int] = field(default_factory=list)
    #: Layers that own an indexer query (``wq_b``, ``weights_proj``) and pick the top-k entries;
    #: the layers after one reuse its picks.
    index_source_layer_ids: list[int] = field(default_factory=list)
    candidate_source_layer_id: int | None = None
    candidate_topk_blocks: int = 0
    candidate_block_size: int = 0
    #: [inferred] Whether the candidate source's own top-k is restricted to its candidate blocks.
    #: SGLang points to "no" (it scores every entry); when candidate_topk_blocks >= index_topk
    #: both readings pick the same entries up to ties, since every top-k entry lies in a block
    #: whose max is among the top index_topk block maxima.
    candidate_source_uses_candidates: bool = False
    engram_layer_ids: list[int] = field(default_factory=list)
    engram_num_embeddings: list[int] = field(default_factory=list)
    engram_max_ngram_size: int = 0
    engram_vocab_size: int | list[int] = 0
    engram_n_heads: int = 0
    engram_head_dim: int = 0
    engram_pad_token_id: int = 0
    engram_compressed_vocab_size: int = 0
    #: [inferred] The base seed of the per-layer hash multipliers (the reference adds
    #: 10007 * layer_id to it); DeepSeek's published demo uses 0 and the config does not say.
    engram_seed: int = 0
    #: mHC collapses each sublayer input with the previous HC's ``pre`` weights (no hc_head).
    hc_pre_from_prev_sublayer: bool = False
    #: The per-head unweighted RMS norm of the attention query (V4 has it, V4.1 does not).
    q_head_norm: bool = True
    #: [inferred] V4.1 routers keep a second selection bias ``bias_vl`` for image tokens.
    moe_image_bias: bool = False
    image_token_id: int | None = None
    pad_token_id: int | None = None
    dspark_block_size: int = 0
    dspark_noise_token_id: int | None = None
    dspark_target_layer_ids: list[int] = field(default_factory=list)
    dspark_markov_rank: int = 0
    dspark_n_routed_experts: int = 0
    dspark_num_experts_per_tok: int = 0
    #: The vision tower's config, kept verbatim (the tower itself is out of scope).
    vision_config: dict[str, Any] | None = None
    #: Top-level keys of a nested (V4.1) config.json other than the ones mapped to fields.
    outer_extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_field_types(self)
        n_all = self.num_hidden_layers + self.num_nextn_predict_layers
        if not self.compress_ratios:
            self.compress_ratios = [0] * n_all
        if len(self.compress_ratios) < self.num_hidden_layers:
            raise ConfigError(
                f"compress_ratios has {len(self.compress_ratios)} entries but the model has "
                f"num_hidden_layers={self.num_hidden_layers}"
            )
        # MTP layers without an entry of their own are sliding-window only, as published.
        self.compress_ratios += [0] * (n_all - len(self.compress_ratios))
        kind_of = _v41_kind_of_ratio if self.is_v41 else _kind_of_ratio
        self.attn_kinds = list(self.attn_kinds) + [
            kind_of(r) for r in self.compress_ratios[len(self.attn_kinds) :]
        ]
        if self.num_attention_heads % self.o_groups:
            raise ConfigError(
                f"num_attention_heads={self.num_attention_heads} is not divisible by "
                f"o_groups={self.o_groups}"
            )
        if self.qk_rope_head_dim % 2 or self.qk_rope_head_dim > self.head_dim:
            raise ConfigError(
                f"qk_rope_head_dim={self.qk_rope_head_dim} must be even and <= head_dim"
            )
        if self.num_experts_per_tok > self.n_routed_experts:
            raise ConfigError(
                f"num_experts_per_tok={self.num_experts_per_tok} exceeds "
                f"n_routed_experts={self.n_routed_experts}",
                "num_experts_per_tok",
            )
        if self.num_key_value_heads != 1:
            raise UnsupportedConfigError(
                f"num_key_value_heads={self.num_key_value_heads}: only shared-KV MQA "
                "(one kv head) is implemented",
                "num_key_value_heads",
            )
        if self.scoring_func not in ("sqrtsoftplus", "sigmoid", "softmax"):
            raise UnsupportedConfigError(
                f"scoring_func={self.scoring_func!r} is not implemented", "scoring_func"
            )
        if self.hidden_act != "silu":
            raise UnsupportedConfigError(
                f"hidden_act={self.hidden_act!r}: only silu is implemented", "hidden_act"
            )
        if self.is_v41:
            from deepinfer.config_v41 import validate_v41  # V4.1's module builds on this one

            validate_v41(self)

    @property
    def is_v41(self) -> bool:
        return self.model_type.startswith(V41_TYPE)

    # -- derived quantities -------------------------------------------------------------------

    @property
    def num_layers_total(self) -> int:
        """Main layers plus MTP layers (the MTP layers follow the main ones in compress_ratios)."""
        return self.num_hidden_layers + self.num_nextn_predict_layers

    def compress_ratio(self, layer_id: int) -> int:
        return self.compress_ratios[layer_id]

    def attn_kind(self, layer_id: int) -> AttnKind:
        return self.attn_kinds[layer_id]

    def is_hash_layer(self, layer_id: int) -> bool:
        """Hash routing applies to the first main layers only; MTP layers (ids after) never hash."""
        return layer_id < min(self.num_hash_layers, self.num_hidden_layers)

    def kv_source_of(self, layer_id: int) -> int | None:
        """The V4.1 KV-source layer whose compressed entries ``layer_id`` attends to."""
        return _latest_at_or_before(self.kv_source_layer_ids, layer_id)

    def index_source_of(self, layer_id: int) -> int | None:
        """The V4.1 index-source layer whose top-k picks ``layer_id`` attends with."""
        return _latest_at_or_before(self.index_source_layer_ids, layer_id)

    # -- construction ---------------------------------------------------------------------------

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ModelConfig:
        """Parse a published config dict: V4 (flat) or V4.1 (nested ``text_config``)."""
        if not isinstance(raw, dict):
            raise ConfigError(f"config.json must hold an object, got {type(raw).__name__}")
        raw = dict(raw)
        model_type = raw.get("model_type", V4_TYPE)
        if not isinstance(model_type, str):
            raise ConfigError(
                f"config.json: model_type must be a string, got {model_type!r}", "model_type"
            )
        if "text_config" in raw or model_type.startswith(V41_TYPE):
            from deepinfer.config_v41 import v41_kwargs

            return cls(**v41_kwargs(raw, {f.name for f in fields(cls)}))
        if model_type != V4_TYPE:
            raise ConfigError(f"model_type={model_type!r} is not a DeepSeek-V4 config")
        names = {f.name for f in fields(cls)} - {"attn_kinds", "extra"} - V41_FIELDS
        kwargs: dict[str, Any] = {k: raw.pop(k) for k in list(raw) if k in names}
        if "dtype" in raw and "torch_dtype" not in kwargs:
            kwargs["torch_dtype"] = raw.pop("dtype")
        # transformers-style schedules are accepted too, so HF configs convert without edits.
        layer_types = str_list(raw.pop("layer_types", None), "layer_types")
        compress_rates = raw.pop("compress_rates", None)
        if not isinstance(compress_rates, dict | None):
            raise ConfigError("config.json: compress_rates must be an object", "compress_rates")
        if layer_types is not None and "compress_ratios" not in kwargs:
            kwargs["compress_ratios"], kwargs["attn_kinds"] = _from_layer_types(
                layer_types, compress_rates or {}
            )
        mlp_layer_types = str_list(raw.pop("mlp_layer_types", None), "mlp_layer_types")
        if mlp_layer_types is not None and "num_hash_layers" not in kwargs:
            kwargs["num_hash_layers"] = _hash_prefix(mlp_layer_types)
        if kwargs.get("rope_scaling") is None and isinstance(raw.get("rope_parameters"), dict):
            compress = raw["rope_parameters"].get("compress")
            if (
                isinstance(compress, dict)
                and compress.get("rope_type", compress.get("type")) == "yarn"
            ):
                kwargs["rope_scaling"] = dict(compress)
        kwargs["extra"] = raw
        return cls(**kwargs)

    @classmethod
    def from_pretrained(cls, path: str | Path) -> ModelConfig:
        path = Path(path)
        file = path / "config.json" if path.is_dir() else path
        if not file.is_file():
            raise ConfigError(f"no config.json at {file}")
        return cls.from_dict(json.loads(file.read_text()))

    def to_dict(self) -> dict[str, Any]:
        """The published format (``compress_ratios``, ``num_hash_layers``), ready for json.dump."""
        if self.is_v41:
            from deepinfer.config_v41 import v41_to_dict

            return v41_to_dict(self)
        out: dict[str, Any] = {
            "architectures": ["DeepseekV4ForCausalLM"],
            **self.extra,
        }
        for f in fields(self):
            if f.name in ("attn_kinds", "extra") or f.name in V41_FIELDS:
                continue
            value = getattr(self, f.name)
            if f.name in ("quantization_config", "expert_dtype") and value is None:
                continue
            out[f.name] = value
        return out


#: Fields only V4.1 configs set (declared after ``extra``); V4 parsing leaves same-named keys in
#: ``extra`` as before.
_FIELD_NAMES = [f.name for f in fields(ModelConfig)]
V41_FIELDS = frozenset(_FIELD_NAMES[_FIELD_NAMES.index("kv_source_layer_ids") :])


def _latest_at_or_before(ids: list[int], layer_id: int) -> int | None:
    found = [i for i in ids if i <= layer_id]
    return max(found) if found else None


def _v41_kind_of_ratio(ratio: int) -> AttnKind:
    return "swa" if ratio == 0 else "sparse"


def _kind_of_ratio(ratio: int) -> AttnKind:
    if ratio == 0:
        return "swa"
    return "csa" if ratio == CSA_RATIO else "hca"


def _from_layer_types(
    layer_types: list[str], compress_rates: dict[str, int]
) -> tuple[list[int], list[AttnKind]]:
    rates = {"compressed_sparse_attention": 4, "heavily_compressed_attention": 128}
    rates.update(compress_rates)
    ratios: list[int] = []
    kinds: list[AttnKind] = []
    for t in layer_types:
        if t not in _HF_LAYER_TYPES:
            raise ConfigError(f"unknown layer type {t!r} in layer_types")
        kinds.append(_HF_LAYER_TYPES[t])
        ratios.append(0 if t == "sliding_attention" else int(rates[t]))
    return ratios, kinds


def _hash_prefix(mlp_layer_types: list[str]) -> int:
    n = 0
    while n < len(mlp_layer_types) and mlp_layer_types[n] == "hash_moe":
        n += 1
    if "hash_moe" in mlp_layer_types[n:]:
        raise ConfigError("hash_moe layers must form a prefix of mlp_layer_types")
    return n
