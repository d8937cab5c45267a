"""Official checkpoint names: the exporter's output and the model's strict loading."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from _v4_oracle import build_hf, load_export_tool

from deepinfer.config import ModelConfig
from deepinfer.models import DeepseekV4ForCausalLM
from deepinfer.models.errors import CheckpointError


@pytest.fixture(scope="module")
def official() -> tuple[dict[str, torch.Tensor], dict]:
    hf = build_hf(0)
    tool = load_export_tool()
    return tool.official_state_dict(hf.state_dict()), tool.official_config(hf.config)


def _model(config: dict) -> DeepseekV4ForCausalLM:
    return DeepseekV4ForCausalLM(ModelConfig.from_dict(config), dtype=torch.float32)


def test_exported_names_are_the_published_patterns(official: tuple[dict, dict]) -> None:
    tensors, _ = official
    names = set(tensors)
    assert {"embed.weight", "head.weight", "norm.weight", "hc_head_fn", "hc_head_base"} <= names
    assert not any(n.startswith("model.") or "self_attn" in n or ".mlp." in n for n in names)
    # CSA layer 1: compressor, indexer with its own compressor; HCA layer 2: no indexer.
    for name in (
        "layers.1.attn.compressor.wkv.weight",
        "layers.1.attn.compressor.ape",
        "layers.1.attn.compressor.norm.weight",
        "layers.1.attn.indexer.compressor.wgate.weight",
        "layers.1.attn.indexer.wq_b.weight",
        "layers.1.attn.indexer.weights_proj.weight",
        "layers.2.attn.compressor.wgate.weight",
        "layers.0.attn.attn_sink",
        "layers.0.attn.kv_norm.weight",
        "layers.0.hc_attn_fn",
        "layers.0.hc_ffn_scale",
        "layers.0.ffn.gate.tid2eid",
        "layers.2.ffn.gate.bias",
        "layers.3.ffn.experts.7.w2.weight",
        "layers.3.ffn.shared_experts.w3.weight",
    ):
        assert name in names, name
    assert not any(n.startswith("layers.2.attn.indexer") for n in names)
    assert not any(n.startswith("layers.0.attn.compressor") for n in names)
    assert "layers.0.ffn.gate.bias" not in names and "layers.2.ffn.gate.tid2eid" not in names
    assert tensors["layers.1.attn.compressor.ape"].shape == (4, 2 * 64)
    assert tensors["layers.2.attn.compressor.ape"].shape == (16, 64)


def test_model_parameters_are_exactly_the_official_names(official: tuple[dict, dict]) -> None:
    tensors, config = official
    model = _model(config)
    expected = model.expected_tensors()
    assert set(expected) == set(tensors)
    for name, t in tensors.items():
        assert tuple(expected[name].shape) == tuple(t.shape), name
    model.load_state(tensors.items())  # strict load succeeds


def test_missing_tensor_is_named(official: tuple[dict, dict]) -> None:
    tensors, config = official
    partial = {k: v for k, v in tensors.items() if k != "layers.3.attn.indexer.wq_b.weight"}
    with pytest.raises(
        CheckpointError, match=r"layers\.3\.attn\.indexer\.wq_b\.weight \(512, 64\)"
    ):
        _model(config).load_state(partial.items())


def test_unexpected_tensor_is_named(official: tuple[dict, dict]) -> None:
    tensors, config = official
    extra = {**tensors, "layers.0.attn.compressor.ape": torch.zeros(4, 128)}
    with pytest.raises(
        CheckpointError, match=r"unexpected tensor 'layers\.0\.attn\.compressor\.ape'"
    ):
        _model(config).load_state(extra.items())


def test_shape_mismatch_names_expected_shape_and_dtype(official: tuple[dict, dict]) -> None:
    tensors, config = official
    bad = {**tensors, "layers.1.attn.wkv.weight": torch.zeros(64, 64)}
    with pytest.raises(
        CheckpointError, match=r"layers\.1\.attn\.wkv\.weight.*\(64, 128\).*float32"
    ):
        _model(config).load_state(bad.items())


def test_int32_hash_table_is_accepted(official: tuple[dict, dict]) -> None:
    tensors, config = official
    t = dict(tensors)
    t["layers.0.ffn.gate.tid2eid"] = tensors["layers.0.ffn.gate.tid2eid"].to(torch.int32)
    model = _model(config)
    model.load_state(t.items())
    assert torch.equal(model.layers[0].ffn.gate.tid2eid, tensors["layers.0.ffn.gate.tid2eid"])


def test_exported_config_is_the_published_format(tmp_path: Path) -> None:
    hf = build_hf(0)
    load_export_tool().export_model(hf, tmp_path, dtype=torch.bfloat16)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["compress_ratios"] == [0, 4, 16, 4, 16, 0]
    assert config["num_hash_layers"] == 2 and config["qk_rope_head_dim"] == 16
    assert config["rope_scaling"]["type"] == "yarn" and config["num_nextn_predict_layers"] == 0
    assert "layer_types" not in config and "rope_parameters" not in config
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert all(
        re.fullmatch(r"model-\d{5}-of-\d{5}\.safetensors", f) for f in index["weight_map"].values()
    )
    from safetensors import safe_open

    shard = tmp_path / index["weight_map"]["layers.0.hc_attn_fn"]
    with safe_open(str(shard), "pt") as f:
        assert f.get_slice("layers.0.hc_attn_fn").get_dtype() == "F32"  # mHC stays fp32
    shard = tmp_path / index["weight_map"]["layers.0.attn.wq_a.weight"]
    with safe_open(str(shard), "pt") as f:
        assert f.get_slice("layers.0.attn.wq_a.weight").get_dtype() == "BF16"
