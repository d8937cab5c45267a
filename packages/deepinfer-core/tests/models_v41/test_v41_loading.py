"""A tiny V4.1 checkpoint under the official names loads through ``load_model``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from _tiny import TEXT, VOCAB, config, tiny_model
from _v41_ref import Reference
from safetensors.torch import save_file

from deepinfer.backends.torch_ref import TorchBackend
from deepinfer.models import DeepseekV41ForCausalLM, load_model
from deepinfer.models.errors import CheckpointError
from deepinfer.models.quant import quant_fp4_e2m1, quant_fp8_block

FP8_SUFFIXES = (
    "attn.wq_a",
    "attn.wq_b",
    "attn.wkv",
    "attn.wo_b",
    "shared_experts.w2",
    "engram.wkv",
)
DRAFT = "mtp.markov_head.weight"  # a DSpark head tensor (names unpublished): kept, not rejected


def _fp8_dequant(q: torch.Tensor, scale: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """W[r, c] = fp8(W[r, c]) * 2**(byte - 127) of block (r // bn, c // bk)."""
    out = torch.empty(q.shape, dtype=torch.float64)
    for r in range(q.shape[0]):
        for c in range(q.shape[1]):
            exp = int(scale[r // block[0], c // block[1]]) - 127
            out[r, c] = float(q[r, c].float()) * 2.0**exp
    return out


def _write(tmp_path: Path, drop: str | None = None, extra: str | None = None) -> dict:
    model = tiny_model(seed=4)
    tensors: dict[str, torch.Tensor] = {}
    for name, value in model.state_dict().items():
        base = name.removesuffix(".weight")
        if name == drop:
            continue
        if name.endswith(".weight") and base.endswith(FP8_SUFFIXES):
            q, s = quant_fp8_block(value, (32, 32))
            tensors[name], tensors[base + ".scale"] = q, s
        elif name == "layers.1.engram.embed.weight":
            q, s = quant_fp8_block(value, (1, 32))  # one scale per 32 values of a row (§5.9)
            tensors[name], tensors[base + ".scale"] = q, s
        elif ".experts." in name and ".shared" not in name:
            tensors[name], tensors[base + ".scale"] = quant_fp4_e2m1(value)
        elif value.dim() >= 2 or "norm" in name:
            tensors[name] = value.to(torch.bfloat16)
        else:
            tensors[name] = value.clone()
    tensors[DRAFT] = torch.randn(VOCAB, 8)
    if extra:
        tensors[extra] = torch.zeros(3)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    raw = config()
    raw["quantization_config"] = {
        "quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [32, 32],
        "scale_fmt": "ue8m0", "expert_dtype": "fp4",
    }  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(raw))
    return tensors


def test_load_quantised_v41_checkpoint(tmp_path: Path) -> None:
    tensors = _write(tmp_path)
    model = load_model(tmp_path, dtype=torch.float32)
    assert isinstance(model, DeepseekV41ForCausalLM) and model.cfg.is_v41
    assert model.cfg.quantization_config["weight_block_size"] == [32, 32]
    assert set(model.draft_tensors) == {DRAFT}
    sd = model.state_dict()
    for name in ("layers.5.attn.wq_b.weight", "layers.1.engram.wkv.weight"):
        base = name.removesuffix(".weight")
        want = _fp8_dequant(tensors[name], tensors[base + ".scale"], (32, 32))
        torch.testing.assert_close(sd[name].double(), want, atol=0, rtol=0)
    name = "layers.1.engram.embed.weight"
    want = _fp8_dequant(tensors[name], tensors[name.replace("weight", "scale")], (1, 32))
    torch.testing.assert_close(sd[name].double(), want, atol=0, rtol=0)
    # The loaded (dequantised) weights run the V4.1 forward as the float64 reference does.
    model.set_engram_token_map(torch.arange(VOCAB))
    ids = torch.randint(0, VOCAB - 1, (1, 11), generator=torch.Generator().manual_seed(2))
    ours = model.forward_logits(ids)[0].double()
    want = Reference(sd, TEXT).logits(ids[0].tolist(), list(range(VOCAB)))
    assert (ours - want).abs().max().item() < 1e-4


def test_missing_and_unexpected_tensors_are_named(tmp_path: Path) -> None:
    missing, unexpected = tmp_path / "missing", tmp_path / "unexpected"
    missing.mkdir()
    unexpected.mkdir()
    _write(missing, drop="layers.5.attn.indexer.wk.weight")
    with pytest.raises(CheckpointError, match=r"layers\.5\.attn\.indexer\.wk\.weight \(16, 32\)"):
        load_model(missing, dtype=torch.float32)
    _write(unexpected, extra="layers.3.attn.compressor.norm.weight")  # 3 is not a KV source
    with pytest.raises(CheckpointError, match=r"layers\.3\.attn\.compressor\.norm\.weight"):
        load_model(unexpected, dtype=torch.float32)


def test_official_key_patterns() -> None:
    names = set(tiny_model().state_dict())
    # KV sources own the compressor (wgate only at ratio 2) and the index keys (§5.1-2, §6.1).
    assert {"layers.2.attn.compressor.wgate.weight", "layers.2.attn.indexer.wk.weight",
            "layers.5.attn.compressor.wkv.weight", "layers.5.attn.indexer.k_norm.weight",
            "layers.7.attn.indexer.wq_b.weight", "layers.7.attn.indexer.weights_proj.weight",
            "layers.1.engram.embed.weight", "layers.1.engram.q_weight",
            "layers.1.engram.k_weight", "layers.4.ffn.gate.bias_vl",
            "mtp.0.e_proj.weight", "mtp.0.hc_head_fn"} <= names  # fmt: skip
    assert "layers.5.attn.compressor.wgate.weight" not in names
    assert not any(
        n.startswith(("layers.3.attn.compressor", "layers.3.attn.indexer")) for n in names
    )
    assert not any(n.startswith("layers.7.attn.indexer.wk") for n in names)
    assert "hc_head_fn" not in names and not any("tid2eid" in n for n in names)


class _Fp8Torch(TorchBackend):
    """The torch reference, keeping FP8 as stored (its reference ``fp8_linear`` runs)."""

    native_formats = frozenset({"fp8"})


def test_engram_tables_stay_fp8_as_stored(tmp_path: Path) -> None:
    """With ``quantization="auto"`` on a backend that computes on FP8, the Engram table holds
    the stored e4m3 rows and ue8m0 bytes, and a lookup decodes exactly what the loader's
    dequantisation gives (e4m3 values times powers of two are fp32 values)."""
    tensors = _write(tmp_path)
    held = load_model(tmp_path, dtype=torch.float32, backend=_Fp8Torch("cpu"))
    plain = load_model(tmp_path, dtype=torch.float32, quantization=None)
    name = "layers.1.engram.embed"
    table = held.get_submodule(name)
    assert table.weight.dtype == torch.uint8 and table.scale is not None
    assert torch.equal(table.weight, tensors[name + ".weight"].view(torch.uint8))
    assert torch.equal(table.scale, tensors[name + ".scale"].view(torch.uint8))
    ids = torch.arange(table.weight.shape[0])
    assert torch.equal(table(ids), plain.get_submodule(name)(ids))
    assert plain.get_submodule(name).weight.dtype == torch.float32
