"""iter_checkpoint_tensors / read_config on small multi-shard checkpoints with official raw names.

Expected values come from the float64 reference decoders in conftest, applied to the stored bytes.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from deepinfer.errors import DeepInferError
from deepinfer.models.errors import CheckpointError
from deepinfer.models.loader import iter_checkpoint_tensors, quant_settings, read_config
from deepinfer.models.quant import quant_fp4_e2m1, quant_fp8_block

HAS_E8M0 = hasattr(torch, "float8_e8m0fnu")

V4_FLASH_QUANT = {
    "activation_scheme": "dynamic",
    "fmt": "e4m3",
    "quant_method": "fp8",
    "scale_fmt": "ue8m0",
    "weight_block_size": [128, 128],
}
V41_CONFIG = {
    "architectures": ["DeepseekV41ForCausalLM"],
    "model_type": "deepseek_v41",
    "quantization_config": {
        "quant_method": "fp8",
        "activation_scheme": "dynamic",
        "weight_block_size": [32, 32],
        "scale_fmt": "ue8m0",
        "expert_dtype": "fp4",
    },
    "text_config": {"model_type": "deepseek_v41_text", "hidden_size": 64, "rms_norm_eps": 1e-20},
    "vision_config": {"model_type": "deepseek_v41_vision", "hidden_size": 32},
}


def _rand(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def _fp8(name: str, shape: tuple[int, int], seed: int, *, block=(128, 128), fmt="ue8m0", e8m0=0):
    q, s = quant_fp8_block(_rand(*shape, seed=seed), block, fmt, as_e8m0_dtype=e8m0)
    return {f"{name}.weight": q, f"{name}.scale": s}


def _fp4(name: str, shape: tuple[int, int], seed: int, *, int8=False, e8m0=False):
    packed, s = quant_fp4_e2m1(_rand(*shape, seed=seed), as_e8m0_dtype=e8m0)
    return {f"{name}.weight": packed.view(torch.int8) if int8 else packed, f"{name}.scale": s}


def _v4_tensors() -> dict[str, torch.Tensor]:
    """A V4-Flash-like tensor set. Stored dtypes the model reference marks as inferred are
    exercised in both variants where cheap: tid2eid as int32 (int64 is the other candidate),
    norms in BF16, packed FP4 as uint8 and as int8, ue8m0 as uint8 and as float8_e8m0fnu."""
    t: dict[str, torch.Tensor] = {
        "embed.weight": _rand(64, 32, seed=1).to(torch.bfloat16),
        "hc_head_scale": torch.tensor([0.75]),  # `_scale`, not `.scale`: an ordinary parameter
        "layers.0.attn.attn_sink": _rand(4, seed=2),
        "layers.0.attn_norm.weight": _rand(256, seed=3).to(torch.bfloat16),
        "layers.0.ffn.gate.tid2eid": torch.randint(0, 8, (100, 2), dtype=torch.int32),
        "layers.0.ffn.gate.bias": _rand(8, seed=4),
        "mtp.0.enorm.weight": _rand(256, seed=5).to(torch.bfloat16),
    }
    t |= _fp8("layers.0.attn.wq_a", (256, 256), seed=6)
    t |= _fp8("layers.0.attn.wo_a", (300, 200), seed=7, e8m0=HAS_E8M0)  # ragged blocks
    t |= _fp8("layers.0.ffn.shared_experts.w1", (128, 384), seed=8, fmt="fp32")  # -Base style
    t |= _fp4("layers.0.ffn.experts.0.w1", (64, 64), seed=9)
    t |= _fp4("layers.0.ffn.experts.0.w2", (64, 96), seed=10, int8=True, e8m0=HAS_E8M0)
    return t


# Shard placement: wq_a's scale lives in a later shard than its weight, wo_a's in an earlier one.
SHARD_OF = {
    "embed.weight": 0,
    "layers.0.attn.wq_a.weight": 0,
    "layers.0.attn.wo_a.scale": 0,
    "layers.0.ffn.experts.0.w1.weight": 0,
    "layers.0.ffn.experts.0.w1.scale": 0,
    "layers.0.ffn.gate.tid2eid": 0,
    "layers.0.attn.attn_sink": 0,
    "hc_head_scale": 0,
    "layers.0.attn.wq_a.scale": 1,
    "layers.0.attn.wo_a.weight": 1,
    "layers.0.attn_norm.weight": 1,
    "layers.0.ffn.experts.0.w2.weight": 1,
    "layers.0.ffn.experts.0.w2.scale": 1,
    "layers.0.ffn.gate.bias": 1,
    "layers.0.ffn.shared_experts.w1.weight": 2,
    "layers.0.ffn.shared_experts.w1.scale": 2,
    "mtp.0.enorm.weight": 2,
}


def _split(tensors: dict[str, torch.Tensor], n: int = 3) -> list[dict[str, torch.Tensor]]:
    shards: list[dict[str, torch.Tensor]] = [{} for _ in range(n)]
    for name, tensor in tensors.items():
        shards[SHARD_OF[name]][name] = tensor
    return shards


def _expected(ref, tensors: dict[str, torch.Tensor], block=(128, 128)) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for name, t in tensors.items():
        if name.endswith(".scale"):
            continue
        scale = tensors.get(name.removesuffix(".weight") + ".scale")
        if scale is None:
            out[name] = t.to(torch.float64).numpy()
        elif t.dtype == torch.float8_e4m3fn:
            out[name] = ref.fp8_block(t, scale, block)
        else:
            out[name] = ref.fp4(t, scale)
    return out


def _check(got: dict[str, torch.Tensor], expected: dict[str, np.ndarray], dtype) -> None:
    assert set(got) == set(expected)
    for name, tensor in got.items():
        if name.endswith("tid2eid"):
            assert tensor.dtype == torch.int64
            np.testing.assert_array_equal(tensor.numpy(), expected[name])
            continue
        assert tensor.dtype == dtype, name
        value = tensor.to(torch.float64).numpy()
        want = torch.from_numpy(expected[name]).to(dtype).to(torch.float64).numpy()
        if "shared_experts" in name and dtype == torch.float32:  # fp32 scale: one rounding
            np.testing.assert_allclose(value, expected[name], rtol=2.0**-24, err_msg=name)
        elif "shared_experts" in name:
            np.testing.assert_allclose(value, expected[name], rtol=2.0**-8, err_msg=name)
        else:  # ue8m0 scales: exact, whatever the output dtype
            np.testing.assert_array_equal(value, want, err_msg=name)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_multi_shard_with_cross_shard_scales(ref, checkpoint, dtype) -> None:
    tensors = _v4_tensors()
    root = checkpoint(_split(tensors), config={"quantization_config": V4_FLASH_QUANT})
    got = dict(iter_checkpoint_tensors(root, dtype=dtype, progress=False))
    assert not any(name.endswith(".scale") for name in got)
    assert "hc_head_scale" in got
    _check(got, _expected(ref, tensors), dtype)


def test_single_file_and_index_path(ref, checkpoint) -> None:
    tensors = _v4_tensors()
    expected = _expected(ref, tensors)
    single = checkpoint([tensors], index=False, name="single")
    _check(dict(iter_checkpoint_tensors(single, progress=False)), expected, torch.float32)
    _check(
        dict(iter_checkpoint_tensors(single / "model.safetensors", progress=False)),
        expected,
        torch.float32,
    )
    sharded = checkpoint(_split(tensors), name="sharded")
    index = sharded / "model.safetensors.index.json"
    _check(dict(iter_checkpoint_tensors(index, progress=False)), expected, torch.float32)


@pytest.mark.parametrize("with_config", [True, False])
def test_v41_32x32_blocks(ref, checkpoint, with_config: bool) -> None:
    tensors = _fp8("layers.2.attn.wq_a", (256, 160), seed=11, block=(32, 32))
    tensors |= _fp8("layers.2.attn.wo_b", (70, 33), seed=12, block=(32, 32))  # ragged
    # Engram tables: one ue8m0 scale per 32 values of a row. The model reference states the
    # granularity; the exact tensor names and the [rows, cols / 32] scale layout are inferred.
    tensors |= _fp8("layers.1.engram.embed", (16, 256), seed=13, block=(1, 32))
    tensors |= _fp4("layers.3.ffn.experts.5.w3", (32, 128), seed=14)
    root = checkpoint([tensors], config=V41_CONFIG if with_config else None)
    got = dict(iter_checkpoint_tensors(root, progress=False))
    expected = {
        "layers.2.attn.wq_a.weight": ref.fp8_block(
            tensors["layers.2.attn.wq_a.weight"], tensors["layers.2.attn.wq_a.scale"], (32, 32)
        ),
        "layers.2.attn.wo_b.weight": ref.fp8_block(
            tensors["layers.2.attn.wo_b.weight"], tensors["layers.2.attn.wo_b.scale"], (32, 32)
        ),
        "layers.1.engram.embed.weight": ref.fp8_block(
            tensors["layers.1.engram.embed.weight"],
            tensors["layers.1.engram.embed.scale"],
            (1, 32),
        ),
        "layers.3.ffn.experts.5.w3.weight": ref.fp4(
            tensors["layers.3.ffn.experts.5.w3.weight"], tensors["layers.3.ffn.experts.5.w3.scale"]
        ),
    }
    _check(got, expected, torch.float32)


def test_v4_base_fp32_scales(ref, checkpoint) -> None:
    tensors = _fp8("layers.0.ffn.experts.3.w2", (256, 128), seed=15, fmt="fp32")
    tensors |= _fp8("layers.0.attn.wkv", (130, 260), seed=16, fmt="fp32")
    assert tensors["layers.0.attn.wkv.scale"].dtype == torch.float32
    root = checkpoint([tensors], config={"quantization_config": {"weight_block_size": [128, 128]}})
    got = dict(iter_checkpoint_tensors(root, dtype=torch.float64, progress=False))
    for name in ("layers.0.ffn.experts.3.w2", "layers.0.attn.wkv"):
        want = ref.fp8_block(tensors[f"{name}.weight"], tensors[f"{name}.scale"], (128, 128))
        np.testing.assert_array_equal(got[f"{name}.weight"].numpy(), want)  # fp64: exact


def test_read_config_v4_and_v41(tmp_path: Path) -> None:
    v4 = {"model_type": "deepseek_v4", "quantization_config": V4_FLASH_QUANT, "expert_dtype": "fp4"}
    (tmp_path / "v4").mkdir()
    (tmp_path / "v4" / "config.json").write_text(json.dumps(v4))
    cfg = read_config(tmp_path / "v4")
    assert cfg == v4
    s = quant_settings(cfg)
    assert (s.weight_block_size, s.scale_fmt, s.expert_dtype) == ((128, 128), "ue8m0", "fp4")

    (tmp_path / "v41.json").write_text(json.dumps(V41_CONFIG))
    cfg = read_config(tmp_path / "v41.json")
    assert cfg["text_config"]["rms_norm_eps"] == 1e-20
    assert cfg["quantization_config"]["weight_block_size"] == [32, 32]
    s = quant_settings(cfg)
    assert (s.weight_block_size, s.scale_fmt, s.expert_dtype) == ((32, 32), "ue8m0", "fp4")
    assert quant_settings({}).weight_block_size is None


def test_read_config_errors(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=r"no config\.json"):
        read_config(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        read_config(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"text_config": [1]}))
    with pytest.raises(CheckpointError, match="text_config"):
        read_config(tmp_path)


def test_yielded_tensors_do_not_alias_the_shard_file(checkpoint) -> None:
    """safetensors returns mmap views; the loader must hand out tensors that own their memory."""
    tensors = {
        "norm.weight": torch.ones(1024),
        "layers.0.ffn.gate.tid2eid": torch.ones(8, 2).long(),
    }
    root = checkpoint([tensors])
    got = dict(iter_checkpoint_tensors(root, progress=False))
    shard = next(root.glob("*.safetensors"))
    size = shard.stat().st_size
    with shard.open("r+b") as fh:  # overwrite every data byte after the header
        header = 8 + int.from_bytes(fh.read(8), "little")
        fh.seek(header)
        fh.write(b"\x00" * (size - header))
    assert torch.equal(got["norm.weight"], torch.ones(1024))
    assert torch.equal(got["layers.0.ffn.gate.tid2eid"], torch.ones(8, 2).long())


def test_progress_bar(checkpoint, capsys) -> None:
    root = checkpoint(_split(_v4_tensors()))
    list(iter_checkpoint_tensors(root, progress=True))
    assert "loading shards" in capsys.readouterr().err
    list(iter_checkpoint_tensors(root, progress=False))
    assert capsys.readouterr().err == ""


def test_early_stop_closes_cleanly(checkpoint) -> None:
    root = checkpoint(_split(_v4_tensors()))
    it = iter_checkpoint_tensors(root, progress=False)
    name, _ = next(it)
    it.close()
    assert name == "embed.weight"


# ------------------------------------------------------------------------------------------------
# Error messages: tensor, shard, expected vs found


def _shard_name(i: int, n: int) -> str:
    return f"model-{i + 1:05d}-of-{n:05d}.safetensors"


def _load_error(root: Path) -> str:
    with pytest.raises(CheckpointError) as info:
        list(iter_checkpoint_tensors(root, progress=False))
    assert isinstance(info.value, DeepInferError)
    return str(info.value)


def test_error_missing_fp8_scale(checkpoint) -> None:
    tensors = _fp8("layers.4.attn.wq_b", (256, 128), seed=20)
    del tensors["layers.4.attn.wq_b.scale"]
    msg = _load_error(checkpoint([{"norm.weight": torch.ones(4)}, tensors]))
    assert "layers.4.attn.wq_b.weight" in msg and _shard_name(1, 2) in msg
    assert "layers.4.attn.wq_b.scale" in msg and "FP8" in msg


def test_error_missing_fp4_scale(checkpoint) -> None:
    tensors = _fp4("layers.1.ffn.experts.7.w2", (32, 64), seed=21)
    del tensors["layers.1.ffn.experts.7.w2.scale"]
    msg = _load_error(checkpoint([tensors]))
    assert "layers.1.ffn.experts.7.w2.weight" in msg and "packed FP4" in msg
    assert _shard_name(0, 1) in msg


def test_error_wrong_fp8_scale_shape(checkpoint) -> None:
    tensors = _fp8("layers.0.attn.wo_b", (256, 256), seed=22)
    tensors["layers.0.attn.wo_b.scale"] = torch.full((2, 3), 127, dtype=torch.uint8)
    shards = [{"layers.0.attn.wo_b.weight": tensors["layers.0.attn.wo_b.weight"]}]
    shards.append({"layers.0.attn.wo_b.scale": tensors["layers.0.attn.wo_b.scale"]})
    msg = _load_error(checkpoint(shards, config={"quantization_config": V4_FLASH_QUANT}))
    assert "layers.0.attn.wo_b.scale" in msg and _shard_name(0, 2) in msg
    assert "[2, 3]" in msg and "expects [2, 2]" in msg and "[256, 256]" in msg


def test_error_wrong_fp4_scale_shape(checkpoint) -> None:
    tensors = _fp4("layers.2.ffn.experts.1.w1", (16, 128), seed=23)
    tensors["layers.2.ffn.experts.1.w1.scale"] = torch.zeros(16, 8, dtype=torch.uint8)
    msg = _load_error(checkpoint([tensors]))
    assert "layers.2.ffn.experts.1.w1" in msg and "[16, 8]" in msg and "expects [16, 4]" in msg


def test_error_bad_scale_dtype(checkpoint) -> None:
    tensors = _fp8("layers.0.attn.wkv", (128, 128), seed=24)
    tensors["layers.0.attn.wkv.scale"] = torch.ones(1, 1, dtype=torch.int32)
    msg = _load_error(checkpoint([tensors]))
    assert "layers.0.attn.wkv.scale" in msg and "torch.int32" in msg


def test_error_scale_on_unquantised_weight_and_orphan_scale(checkpoint) -> None:
    bf16 = {"head.weight": torch.ones(4, 4, dtype=torch.bfloat16), "head.scale": torch.ones(1, 1)}
    msg = _load_error(checkpoint([bf16], name="a"))
    assert "head.weight" in msg and "torch.bfloat16" in msg
    orphan = {"layers.0.attn.wq_a.scale": torch.ones(1, 1, dtype=torch.uint8)}
    msg = _load_error(checkpoint([orphan], name="b"))
    assert "layers.0.attn.wq_a.scale" in msg and "no weight" in msg


def test_error_index_inconsistent(checkpoint, tmp_path: Path) -> None:
    root = checkpoint([{"norm.weight": torch.ones(4)}, {"head.weight": torch.ones(4, 4)}])
    index = json.loads((root / "model.safetensors.index.json").read_text())
    index["weight_map"]["layers.9.attn_norm.weight"] = _shard_name(0, 2)
    (root / "model.safetensors.index.json").write_text(json.dumps(index))
    msg = _load_error(root)
    assert "layers.9.attn_norm.weight" in msg and _shard_name(0, 2) in msg
    (root / _shard_name(1, 2)).unlink()
    assert _shard_name(1, 2) in _load_error(root)
    assert "does not exist" in _load_error(tmp_path / "nowhere")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_dequantisation_matches_cpu(checkpoint) -> None:
    """On a GPU the raw bytes move first and the arithmetic runs there; results are identical."""
    root = checkpoint(_split(_v4_tensors()), config={"quantization_config": V4_FLASH_QUANT})
    for dtype in (torch.float32, torch.bfloat16):
        cpu = dict(iter_checkpoint_tensors(root, dtype=dtype, progress=False))
        gpu = dict(iter_checkpoint_tensors(root, dtype=dtype, device="cuda", progress=False))
        assert set(cpu) == set(gpu)
        for name, tensor in gpu.items():
            assert tensor.device.type == "cuda", name
            assert torch.equal(tensor.cpu(), cpu[name]), name


def test_float_scale_without_weight_passes_through(checkpoint) -> None:
    """A float `.scale` with no `.weight` beside it is an ordinary parameter, not a quant scale."""
    root = checkpoint([{"vision.blocks.0.ls.scale": torch.full((8,), 0.5)}])
    got = dict(iter_checkpoint_tensors(root, dtype=torch.bfloat16, progress=False))
    assert torch.equal(got["vision.blocks.0.ls.scale"], torch.full((8,), 0.5, dtype=torch.bfloat16))
    with pytest.raises(CheckpointError, match="floating-point"):
        next(iter_checkpoint_tensors(root, dtype=torch.int64))
