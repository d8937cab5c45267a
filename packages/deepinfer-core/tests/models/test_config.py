"""ModelConfig parses config.json as DeepSeek publishes it."""

from __future__ import annotations

import pytest
from _published import FLASH

from deepinfer.config import ConfigError, ModelConfig


def test_published_flash_config() -> None:
    cfg = ModelConfig.from_dict(FLASH)
    assert len(cfg.compress_ratios) == 44 and cfg.num_layers_total == 44
    main = cfg.attn_kinds[:43]
    assert (main.count("swa"), main.count("csa"), main.count("hca")) == (2, 21, 20)
    assert cfg.attn_kinds[43] == "swa"  # the MTP layer
    assert [cfg.is_hash_layer(i) for i in (0, 2, 3, 43)] == [True, True, False, False]
    assert cfg.quantization_config == FLASH["quantization_config"]
    assert cfg.expert_dtype == "fp4"
    assert cfg.extra["attention_dropout"] == 0.0  # unknown keys are kept, not dropped


def test_any_ratio_and_missing_mtp_entries() -> None:
    raw = {**FLASH, "num_hidden_layers": 4, "compress_ratios": [0, 4, 16, 64]}
    cfg = ModelConfig.from_dict(raw)
    assert cfg.attn_kinds == ["swa", "csa", "hca", "hca", "swa"]
    assert cfg.compress_ratios == [0, 4, 16, 64, 0]


def test_transformers_style_schedule_is_accepted() -> None:
    raw = {k: v for k, v in FLASH.items() if k not in ("compress_ratios", "num_hash_layers")}
    raw.update(
        num_hidden_layers=3,
        layer_types=["sliding_attention", "compressed_sparse_attention",
                     "heavily_compressed_attention"],
        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 16},
        mlp_layer_types=["hash_moe", "moe", "moe"],
    )  # fmt: skip
    cfg = ModelConfig.from_dict(raw)
    assert cfg.compress_ratios[:3] == [0, 4, 16] and cfg.num_hash_layers == 1


def test_v41_nested_config_is_parsed_not_taken_for_v4() -> None:
    """V4.1's nested text_config has its own parser (tests/models_v41/test_v41_config.py)."""
    raw = {"model_type": "deepseek_v41", "text_config": {"model_type": "deepseek_v41_text"}}
    cfg = ModelConfig.from_dict(raw)
    assert cfg.is_v41 and cfg.num_hash_layers == 0 and not cfg.q_head_norm
    with pytest.raises(ConfigError, match=r"not DeepSeek-V4\.1"):
        ModelConfig.from_dict({"model_type": "deepseek_v4", "text_config": {}})


def test_round_trip_keeps_published_fields() -> None:
    cfg = ModelConfig.from_dict(FLASH)
    again = ModelConfig.from_dict(cfg.to_dict())
    assert again == cfg
    assert cfg.to_dict()["compress_ratios"] == FLASH["compress_ratios"]
