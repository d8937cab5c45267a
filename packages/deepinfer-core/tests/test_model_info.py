"""`deepinfer info --model`: the published V4-Flash / V4.1-Flash configs against the spec.

Parameter counts are checked against docs/model-deepseek-v4.md §2.4: exactly where the spec
states an exact count (V4-Flash rows, measured on the meta device), and to the last digit the
spec prints otherwise (half a unit of it: V4-Flash total 284.33 B, V4.1 rows such as 543.6 B).
Stored bytes are recomputed here from the config's dimensions and the §6.1/§6.3 formats.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
from pathlib import Path

import pytest
import torch

from deepinfer import model_info
from deepinfer.cache.pools import state_bytes
from deepinfer.cli import main
from deepinfer.config import ModelConfig

ROOT = Path(__file__).resolve().parents[3]
V4 = ROOT / "examples" / "configs" / "deepseek-v4-flash"
V41 = ROOT / "examples" / "configs" / "deepseek-v4.1-flash"
B = 1e9


@pytest.fixture(scope="module")
def v4() -> model_info.ModelReport:
    return model_info.model_report(V4)


@pytest.fixture(scope="module")
def v41() -> model_info.ModelReport:
    return model_info.model_report(V41)


def test_v4_flash_counts_match_spec_rows(v4: model_info.ModelReport) -> None:
    k = {name: size.params for name, size in v4.kinds.items()}
    assert k["routed_experts"] == 43 * 256 * 3 * 4096 * 2048 == 277_025_390_592
    assert k["attention"] == 4_599_123_136
    assert k["shared_experts"] == 43 * 3 * 4096 * 2048 == 1_082_130_432
    assert k["embedding"] == k["lm_head"] == 529_530_880
    assert k["compressor"] == 261_464_576
    assert k["indexer"] == 225_730_176
    assert k["mhc"] == 33_884_439
    assert k["norms"] == 356_352
    # The spec's router row counts the gate weights only; the 40 learned layers add a bias each.
    assert k["router"] == 45_088_768 + 40 * 256
    assert abs(v4.params_without_mtp / B - 284.33) <= 0.005
    assert abs(k["mtp"] / B - 6.6) <= 0.2  # "about one full layer (~6.6 B) plus 2·d²"


def test_v41_flash_counts_match_spec(v41: model_info.ModelReport) -> None:
    k = {name: size.params for name, size in v41.kinds.items()}
    assert k["routed_experts"] == 40 * 384 * 3 * 5120 * 2304
    assert abs(k["routed_experts"] / B - 543.6) <= 0.05
    assert abs(k["shared_experts"] / B - 1.42) <= 0.005
    assert abs((k["embedding"] + k["lm_head"]) / B - 1.32) <= 0.005
    # §2.4's 5.07 B is [I] arithmetic; the projections alone are 5.0646 B, so allow 0.01 B.
    assert abs(k["attention"] / B - 5.07) <= 0.01
    assert abs(k["engram_table"] / B - 196.6) <= 0.05
    assert abs(k["engram_other"] / B - 0.31) <= 0.005
    core = v41.params_without_mtp - k["engram_table"] - k["engram_other"]
    assert abs(core / B - 551.6) <= 0.05
    assert abs(k["mtp"] / B - 41) <= 0.5
    assert abs(v41.kinds["engram_table"].stored_bytes / 2**30 - 188.8) <= 0.05  # §2.4


def _fp8(rows: int, cols: int, block: int) -> int:
    return rows * cols + math.ceil(rows / block) * math.ceil(cols / block)  # ue8m0: 1 byte


@pytest.mark.parametrize(("path", "block"), [(V4, 128), (V41, 32)])
def test_stored_bytes_from_first_principles(path: Path, block: int) -> None:
    raw = json.loads((path / "config.json").read_text())
    text = raw.get("text_config", raw)
    layers, d = text["num_hidden_layers"], text["hidden_size"]
    inter, experts = text["moe_intermediate_size"], text["n_routed_experts"]
    report = model_info.model_report(path)
    # Routed experts: FP4 e2m1 (half a byte) + one ue8m0 byte per 32 values along the input dim.
    per_expert = 2 * (inter * d // 2 + inter * d // 32) + (d * inter // 2 + d * inter // 32)
    assert report.kinds["routed_experts"].stored_bytes == layers * experts * per_expert
    # Shared experts: three FP8 e4m3 matrices with one ue8m0 scale per block.
    shared = 2 * _fp8(inter, d, block) + _fp8(d, inter, block)
    assert report.kinds["shared_experts"].stored_bytes == layers * shared
    assert report.kinds["routed_experts"].bf16_bytes == layers * experts * 3 * d * inter * 2


def test_state_bytes_come_from_the_pool(v4: model_info.ModelReport) -> None:
    cfg = ModelConfig.from_pretrained(V4)
    assert v4.state["bytes_per_sequence"] == state_bytes(cfg, torch.bfloat16, 65536)
    assert v4.state["fixed_bytes"] == state_bytes(cfg, torch.bfloat16, 0)
    assert v4.gpus["state_bytes"] == 64 * state_bytes(cfg, torch.bfloat16, 65536)


@pytest.mark.parametrize("name", ["v4", "v41"])
def test_gpu_count_is_the_smallest_that_fits(name: str, request: pytest.FixtureRequest) -> None:
    g = request.getfixturevalue(name).gpus
    args = (g["replicated_bytes"], g["split_bytes"], g["state_bytes"], g["usable_bytes"])
    n = g["gpus_needed"]
    assert n is not None and model_info.fits(n, *args) and not model_info.fits(n - 1, *args)
    rep, split, state, usable = args
    assert rep + split / n + state <= usable
    assert n == 1 or usable < rep + split / (n - 1) + state


def test_gpu_count_none_when_replicated_part_never_fits() -> None:
    assert model_info.gpus_needed(100, 10, 1, 100) is None
    assert model_info.gpus_needed(10, 0, 1, 100) == 1


def test_cli_json() -> None:
    with contextlib.redirect_stdout(io.StringIO()) as out:
        rc = main(["info", "--model", str(V4), "--json"])
    assert rc == 0
    data = json.loads(out.getvalue())
    assert data["model_type"] == "deepseek_v4"
    assert data["kinds"]["routed_experts"]["params"] == 277_025_390_592
    assert {"stored_bytes", "bf16_bytes", "params"} <= set(data)
    assert data["state"]["max_model_len"] == 65536
    assert data["gpus"]["gpus_needed"] >= 1 and data["gpus"]["num_seqs"] == 64


@pytest.mark.parametrize("name", ["v4", "v41"])
def test_held_bytes_are_the_stored_ones_plus_what_is_kept_wider(
    name: str, request: pytest.FixtureRequest
) -> None:
    """Held as stored, every kind takes its stored bytes, but FP8 block scales held as fp32
    (3 bytes more per block of 128 x 128 or 32 x 32 values: under 0.5%) and the kinds the model
    keeps in fp32 where the checkpoint has bf16 (router gate, compressors, LM head: at most
    twice)."""
    report: model_info.ModelReport = request.getfixturevalue(name)
    wider = {"router", "compressor", "lm_head", "indexer"}
    for kind, size in report.kinds.items():
        most = 2 if kind in wider else 1.005
        assert size.stored_bytes <= size.held_bytes <= most * size.stored_bytes, kind
    assert report.stored_bytes < report.held_bytes < 1.02 * report.stored_bytes
