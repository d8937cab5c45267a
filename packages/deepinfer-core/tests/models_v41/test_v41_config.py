"""ModelConfig parses the published DeepSeek-V4.1-Flash config.json (nested text_config)."""

from __future__ import annotations

import copy
import json

import pytest
from _tiny import CONFIG

from deepinfer.config import ConfigError, ModelConfig

# model reference §2.3, with compress_ratios written out as the literal 43-entry list.
PUBLISHED: dict = {
    "architectures": ["DeepseekV41ForCausalLM"], "model_type": "deepseek_v41", "dtype": "bfloat16",
    "bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 2, "image_token_id": 129264,
    "quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic",
                            "weight_block_size": [32, 32], "scale_fmt": "ue8m0",
                            "expert_dtype": "fp4"},
    "text_config": {
        "model_type": "deepseek_v41_text", "vocab_size": 129280, "hidden_size": 5120,
        "num_hidden_layers": 40, "num_attention_heads": 64, "num_key_value_heads": 1,
        "head_dim": 512, "qk_rope_head_dim": 64, "q_lora_rank": 1280, "o_lora_rank": 1024,
        "o_groups": 8, "hidden_act": "silu", "swiglu_limit": 10.0, "rms_norm_eps": 1e-20,
        "attention_bias": False, "max_position_embeddings": 1048576, "rope_theta": 10000,
        "compress_rope_theta": 160000,
        "rope_scaling": {"rope_type": "yarn", "factor": 16, "beta_fast": 32, "beta_slow": 1,
                         "original_max_position_embeddings": 65536},
        "moe_intermediate_size": 2304, "n_routed_experts": 384, "n_shared_experts": 1,
        "num_experts_per_tok": 6, "scoring_func": "sqrtsoftplus", "topk_method": "noaux_tc",
        "norm_topk_prob": True, "routed_scaling_factor": 1.5, "sliding_window": 128,
        "compress_ratios": [0, 0] + [2] * 18 + [1] * 20 + [0, 0, 0],
        "kv_source_layer_ids": [2, 8, 14, 20],
        "index_source_layer_ids": [2, 8, 14, 20, 24, 28, 32, 36],
        "index_n_heads": 32, "index_head_dim": 128, "index_topk": 512,
        "candidate_source_layer_id": 20, "candidate_topk_blocks": 2048, "candidate_block_size": 8,
        "hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-06,
        "engram_layer_ids": [1, 14], "engram_num_embeddings": [384006168, 384016682],
        "engram_max_ngram_size": 4, "engram_vocab_size": 16000000, "engram_n_heads": 8,
        "engram_head_dim": 256, "engram_pad_token_id": 2, "engram_compressed_vocab_size": 99092,
        "num_nextn_predict_layers": 3,
        "dspark_block_size": 5, "dspark_noise_token_id": 128799,
        "dspark_target_layer_ids": [37, 38, 39], "dspark_markov_rank": 256,
        "dspark_n_routed_experts": 128, "dspark_num_experts_per_tok": 3,
    },
    "vision_config": {"model_type": "deepseek_v41_vision", "num_hidden_layers": 32,
                      "hidden_size": 1024, "num_attention_heads": 16, "intermediate_size": 2816,
                      "patch_size": 14, "rope_theta": 10000, "downsample_ratio": 3,
                      "max_image_tokens": 1024, "min_pixels": 295936, "max_wh_ratio": None},
}  # fmt: skip


def test_published_v41_config() -> None:
    cfg = ModelConfig.from_dict(copy.deepcopy(PUBLISHED))
    assert cfg.is_v41 and cfg.model_type == "deepseek_v41"
    assert cfg.num_hidden_layers == 40 and cfg.num_layers_total == 43
    assert cfg.rms_norm_eps == 1e-20 and cfg.hidden_size == 5120 and cfg.torch_dtype == "bfloat16"
    assert cfg.attn_kinds[:2] == ["swa", "swa"] and cfg.attn_kinds[40:] == ["swa"] * 3
    assert set(cfg.attn_kinds[2:40]) == {"sparse"}
    # V4.1 switches: no hash routing, no per-head q norm, lagged mHC, image router bias.
    assert cfg.num_hash_layers == 0 and not any(cfg.is_hash_layer(i) for i in range(43))
    assert cfg.hc_pre_from_prev_sublayer and not cfg.q_head_norm and cfg.moe_image_bias
    assert cfg.image_token_id == 129264 and cfg.pad_token_id == 2
    assert cfg.quantization_config == PUBLISHED["quantization_config"]
    assert cfg.vision_config == PUBLISHED["vision_config"]
    assert cfg.dspark_target_layer_ids == [37, 38, 39] and cfg.dspark_n_routed_experts == 128


def test_layer_groups() -> None:
    cfg = ModelConfig.from_dict(copy.deepcopy(PUBLISHED))
    # groups: 2-7 read layer 2, 8-13 layer 8, 14-19 layer 14, 20-39 layer 20 (§5.1)
    assert [cfg.kv_source_of(i) for i in (2, 7, 8, 13, 14, 19, 20, 39)] == [
        2, 2, 8, 8, 14, 14, 20, 20
    ]  # fmt: skip
    # 20-23 reuse layer 20's picks, 24-27 layer 24's (scored against layer 20's keys) (§5.2)
    assert [cfg.index_source_of(i) for i in (21, 23, 24, 27, 36, 39)] == [20, 20, 24, 24, 36, 36]
    assert cfg.kv_source_of(1) is None


def test_round_trip_keeps_the_nested_layout() -> None:
    cfg = ModelConfig.from_dict(copy.deepcopy(PUBLISHED))
    out = json.loads(json.dumps(cfg.to_dict()))
    assert out["model_type"] == "deepseek_v41" and out["text_config"]["rms_norm_eps"] == 1e-20
    assert out["quantization_config"] == PUBLISHED["quantization_config"]
    assert out["text_config"]["compress_ratios"] == PUBLISHED["text_config"]["compress_ratios"]
    assert "text_config" not in out["text_config"]
    assert ModelConfig.from_dict(out) == cfg


def test_v4_parsing_is_unchanged_by_v41_fields() -> None:
    v4 = {"model_type": "deepseek_v4", "num_hidden_layers": 2, "compress_ratios": [0, 4]}
    cfg = ModelConfig.from_dict({**v4, "q_head_norm": False})
    assert not cfg.is_v41 and cfg.q_head_norm and cfg.extra["q_head_norm"] is False
    assert "kv_source_layer_ids" not in cfg.to_dict()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"compress_ratios": [0, 0, 2, 2, 2, 1, 1, 4, 0]}, "ratio 1 or 2"),
        ({"kv_source_layer_ids": [3, 5]}, "no KV-source layer"),
        ({"index_source_layer_ids": [2, 7]}, "no index source"),
        ({"candidate_source_layer_id": 6}, "not an index source"),
        ({"engram_num_embeddings": [61]}, "engram_num_embeddings"),
    ],
)
def test_bad_wiring_is_named(change: dict, message: str) -> None:
    from deepinfer.models import DeepseekV41ForCausalLM

    raw = copy.deepcopy(CONFIG)
    raw["text_config"].update(change)
    with pytest.raises((ConfigError, NotImplementedError), match=message):
        DeepseekV41ForCausalLM(ModelConfig.from_dict(raw))


def test_published_model_size_matches_the_spec_arithmetic() -> None:
    """§2.4: text core ~551.6 B, Engram tables 196.6 B + projections 0.31 B, 3 MTP ~41 B."""
    from deepinfer.models import DeepseekV41ForCausalLM

    cfg = ModelConfig.from_dict(copy.deepcopy(PUBLISHED))
    model = DeepseekV41ForCausalLM(cfg, device="meta")
    count: dict[str, int] = {"engram": 0, "mtp": 0, "text": 0}
    for name, p in model.named_parameters():
        part = "engram" if ".engram." in name else "mtp" if name.startswith("mtp.") else "text"
        count[part] += p.numel()
    assert count["engram"] == (384006168 + 384016682) * 256 + 2 * (24 * 256 * 5 * 5120 + 8 * 5120)
    assert abs(count["text"] / 551.6e9 - 1) < 2e-3
    assert abs(count["mtp"] / 41e9 - 1) < 0.02
