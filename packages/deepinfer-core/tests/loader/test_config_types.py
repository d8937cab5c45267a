"""A config.json field of the wrong type or out of range is a ConfigError naming the field.

The expected JSON type of every field is written out below from the published configs (V4-Flash
flat, V4.1 nested), not read from ModelConfig's annotations, and each field is given every
value of a small palette that its type excludes, in both layouts. A field added to ModelConfig
without an entry here fails ``test_table_covers_every_field``.
"""

from __future__ import annotations

import copy
import importlib.util
import json
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

from deepinfer.assets import TINY_DIR
from deepinfer.config import ConfigError, ModelConfig

_spec = importlib.util.spec_from_file_location(
    "published_configs", Path(__file__).resolve().parents[1] / "models" / "_published.py"
)
assert _spec is not None and _spec.loader is not None
_published = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_published)
FLASH: dict[str, Any] = _published.FLASH
#: The embedded tiny model's config.json: the published V4.1 layout.
V41: dict[str, Any] = json.loads((TINY_DIR / "config.json").read_text())

#: One value of each JSON kind; a field accepts the kinds listed for it below.
PALETTE: dict[str, Any] = {
    "int": 7,
    "float": 7.5,
    "bool": True,
    "str": "7",
    "int_list": [7],
    "object": {"k": 7},
    "null": None,
}
INT, FLOAT, BOOL, STR = {"int"}, {"int", "float"}, {"bool"}, {"str"}
INT_LIST, OPT_INT, OPT_OBJECT = {"int_list"}, {"int", "null"}, {"object", "null"}

V4_KINDS: dict[str, set[str]] = {
    "model_type": STR,
    "vocab_size": INT,
    "hidden_size": INT,
    "num_hidden_layers": INT,
    "num_attention_heads": INT,
    "num_key_value_heads": INT,
    "head_dim": INT,
    "qk_rope_head_dim": INT,
    "q_lora_rank": INT,
    "o_groups": INT,
    "o_lora_rank": INT,
    "moe_intermediate_size": INT,
    "n_routed_experts": INT,
    "n_shared_experts": INT,
    "num_experts_per_tok": INT,
    "scoring_func": STR,
    "topk_method": STR,
    "norm_topk_prob": BOOL,
    "routed_scaling_factor": FLOAT,
    "num_hash_layers": INT,
    "swiglu_limit": FLOAT,
    "hidden_act": STR,
    "sliding_window": INT,
    "compress_ratios": INT_LIST,
    "index_n_heads": INT,
    "index_head_dim": INT,
    "index_topk": INT,
    "hc_mult": INT,
    "hc_sinkhorn_iters": INT,
    "hc_eps": FLOAT,
    "rope_theta": FLOAT,
    "compress_rope_theta": FLOAT,
    "rope_scaling": OPT_OBJECT,
    "max_position_embeddings": INT,
    "rms_norm_eps": FLOAT,
    "num_nextn_predict_layers": INT,
    "tie_word_embeddings": BOOL,
    "bos_token_id": OPT_INT,
    "eos_token_id": {"int", "int_list", "null"},
    "torch_dtype": STR,
    "quantization_config": OPT_OBJECT,
    "expert_dtype": {"str", "null"},
}
V41_ONLY_KINDS: dict[str, set[str]] = {
    "kv_source_layer_ids": INT_LIST,
    "index_source_layer_ids": INT_LIST,
    "candidate_source_layer_id": OPT_INT,
    "candidate_topk_blocks": INT,
    "candidate_block_size": INT,
    "candidate_source_uses_candidates": BOOL,
    "engram_layer_ids": INT_LIST,
    "engram_num_embeddings": INT_LIST,
    "engram_max_ngram_size": INT,
    "engram_vocab_size": {"int", "int_list"},
    "engram_n_heads": INT,
    "engram_head_dim": INT,
    "engram_pad_token_id": INT,
    "engram_compressed_vocab_size": INT,
    "engram_seed": INT,
    "hc_pre_from_prev_sublayer": BOOL,
    "q_head_norm": BOOL,
    "moe_image_bias": BOOL,
    "image_token_id": OPT_INT,
    "pad_token_id": OPT_INT,
    "dspark_block_size": INT,
    "dspark_noise_token_id": OPT_INT,
    "dspark_target_layer_ids": INT_LIST,
    "dspark_markov_rank": INT,
    "dspark_n_routed_experts": INT,
    "dspark_num_experts_per_tok": INT,
    "vision_config": OPT_OBJECT,
}
KINDS = {**V4_KINDS, **V41_ONLY_KINDS}
#: Keys a published V4.1 config.json holds at its top level (config field -> JSON key).
V41_TOP_LEVEL = {
    "model_type": "model_type",
    "torch_dtype": "dtype",
    "quantization_config": "quantization_config",
    "image_token_id": "image_token_id",
    "bos_token_id": "bos_token_id",
    "eos_token_id": "eos_token_id",
    "pad_token_id": "pad_token_id",
    "vision_config": "vision_config",
    "tie_word_embeddings": "tie_word_embeddings",
}
#: Sizes and counts for which zero makes no model.
POSITIVE = [
    "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "head_dim",
    "q_lora_rank", "o_groups", "o_lora_rank", "moe_intermediate_size", "n_routed_experts",
    "num_experts_per_tok", "sliding_window", "index_n_heads", "index_head_dim", "index_topk",
    "hc_mult", "hc_sinkhorn_iters", "max_position_embeddings",
]  # fmt: skip


def _v4_with(name: str, value: Any) -> dict[str, Any]:
    raw = copy.deepcopy(FLASH)
    raw[name] = value
    return raw


def _v41_with(name: str, value: Any) -> dict[str, Any]:
    raw = copy.deepcopy(V41)
    if name in V41_TOP_LEVEL:
        raw[V41_TOP_LEVEL[name]] = value
    else:
        raw["text_config"][name] = value
    return raw


def _assert_named(raw: dict[str, Any], name: str) -> None:
    with pytest.raises(ConfigError) as info:
        ModelConfig.from_dict(raw)
    assert info.value.field == name and name in str(info.value), str(info.value)


def test_table_covers_every_field() -> None:
    bookkeeping = {"attn_kinds", "extra", "outer_extra"}  # derived, or unknown keys kept
    assert set(KINDS) == {f.name for f in fields(ModelConfig)} - bookkeeping


def test_published_configs_parse_and_take_every_accepted_kind() -> None:
    ModelConfig.from_dict(copy.deepcopy(FLASH))
    ModelConfig.from_dict(copy.deepcopy(V41))
    # an int where a float is published is the same number
    cfg = ModelConfig.from_dict(_v4_with("routed_scaling_factor", 2))
    assert cfg.routed_scaling_factor == 2.0 and isinstance(cfg.routed_scaling_factor, float)
    assert ModelConfig.from_dict(_v4_with("eos_token_id", [1, 2])).eos_token_id == [1, 2]
    assert ModelConfig.from_dict(_v4_with("rope_scaling", None)).rope_scaling is None


@pytest.mark.parametrize("name", list(V4_KINDS))
def test_wrong_type_in_a_v4_config(name: str) -> None:
    wrong = [kind for kind in PALETTE if kind not in V4_KINDS[name]]
    assert wrong
    for kind in wrong:
        _assert_named(_v4_with(name, copy.deepcopy(PALETTE[kind])), name)


@pytest.mark.parametrize("name", list(KINDS))
def test_wrong_type_in_a_v41_config(name: str) -> None:
    for kind, value in PALETTE.items():
        if kind not in KINDS[name]:
            _assert_named(_v41_with(name, copy.deepcopy(value)), name)


def test_wrong_type_inside_a_list_is_named() -> None:
    _assert_named(_v4_with("compress_ratios", [0, 0, "4", *FLASH["compress_ratios"][3:]]),
                  "compress_ratios")  # fmt: skip
    _assert_named(_v4_with("eos_token_id", [1, 2.5]), "eos_token_id")


@pytest.mark.parametrize("name", POSITIVE)
def test_zero_size_is_named(name: str) -> None:
    _assert_named(_v4_with(name, 0), name)
    _assert_named(_v41_with(name, 0), name)


@pytest.mark.parametrize(
    "name", [n for n, kinds in KINDS.items() if "int" in kinds and n != "engram_seed"]
)
def test_negative_count_or_id_is_named(name: str) -> None:
    if name in V4_KINDS:
        _assert_named(_v4_with(name, -1), name)
    _assert_named(_v41_with(name, -1), name)


def test_more_experts_per_token_than_experts() -> None:
    _assert_named(_v4_with("num_experts_per_tok", 257), "num_experts_per_tok")


def test_not_an_object() -> None:
    with pytest.raises(ConfigError, match="object"):
        ModelConfig.from_dict([FLASH])  # type: ignore[arg-type]
