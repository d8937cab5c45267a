"""DeepSeek-V4 logits against transformers' deepseek_v4, read from an official-name checkpoint.

Each tiny config switches on every V4 feature: sliding-only, CSA (ratio-4 overlap compressor and
lightning indexer with 16 heads so top-k has no ties) and HCA layers, hash-routed and learned MoE
layers with random aux-free bias, random sinks and position biases, and expert weights large
enough that the SwiGLU clamp fires. Full forward, odd chunked prefill and token-by-token decode
must all match transformers' full forward within 1e-4 in fp32.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
from _v4_oracle import build_hf, load_export_tool
from torch import Tensor

from deepinfer.backends.torch_ref import TorchBackend
from deepinfer.models import DeepseekV4ForCausalLM, load_model
from deepinfer.models.state_views import clone_state

TOL = 1e-4


class RecordingBackend(TorchBackend):
    """The reference ops, noting whether the features under test actually did something."""

    def __init__(self) -> None:
        super().__init__("cpu")
        self.clamp_fired = False
        self.topk_dropped = False
        self.sink_used = False

    def _clamped_swiglu(self, gate: Tensor, up: Tensor, limit: float) -> Tensor:  # type: ignore[override]
        if (gate > limit).any() or (up.abs() > limit).any():
            self.clamp_fired = True
        return TorchBackend._clamped_swiglu(gate, up, limit)

    def indexer_topk(  # noqa: PLR0917
        self,
        q: Tensor,
        keys: Tensor,
        weights: Tensor,
        n_visible: Tensor,
        topk: int,
        weight_scale: float = 1.0,
    ) -> Tensor:
        if bool((n_visible > topk).any()):
            self.topk_dropped = True
        return super().indexer_topk(q, keys, weights, n_visible, topk, weight_scale)

    def attention(self, q: Tensor, kv: Tensor, mask: Tensor, sinks: Tensor, scale: float) -> Tensor:
        if bool((sinks.abs() > 0.1).any()):
            self.sink_used = True
        return super().attention(q, kv, mask, sinks, scale)

    def sparse_attention(
        self, q: Tensor, kv: Tensor, index: Tensor, sinks: Tensor, scale: float
    ) -> Tensor:
        if bool((sinks.abs() > 0.1).any()):
            self.sink_used = True
        return super().sparse_attention(q, kv, index, sinks, scale)


@dataclass
class Case:
    name: str
    overrides: dict[str, Any]
    seq: int
    chunks: list[int]
    decode_from: int = 0  # decode token by token from here (prefill before it)
    batch: int = 2
    seed: int = 0
    kinds: set[str] = field(default_factory=set)


CASES = [
    Case(
        "swa-csa-hca16",
        {},
        seq=100,
        chunks=[5, 13, 7, 29, 1, 1, 44],
        kinds={"swa", "csa", "hca"},
    ),
    Case(
        "csa-first-hca8-groups4-hc3",
        {
            "num_hidden_layers": 5,
            "layer_types": [
                "compressed_sparse_attention",
                "heavily_compressed_attention",
                "sliding_attention",
                "compressed_sparse_attention",
                "heavily_compressed_attention",
            ],
            "compress_rates": {"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
            "num_hash_layers": 1,
            "sliding_window": 8,
            "num_attention_heads": 8,
            "o_groups": 4,
            "index_topk": 4,
            "num_experts_per_tok": 3,
            "routed_scaling_factor": 2.5,
            "head_dim": 128,
            "qk_rope_head_dim": 32,
            "index_head_dim": 48,
            "hc_mult": 3,
            "hc_sinkhorn_iters": 10,
        },
        seq=77,
        chunks=[3, 30, 1, 2, 41],
        seed=3,
        kinds={"swa", "csa", "hca"},
    ),
    Case(
        "hca128-no-hash",
        {
            "num_hidden_layers": 2,
            "layer_types": ["heavily_compressed_attention", "compressed_sparse_attention"],
            "compress_rates": {
                "compressed_sparse_attention": 4,
                "heavily_compressed_attention": 128,
            },
            "num_hash_layers": 0,
            "sliding_window": 32,
            "index_topk": 16,
        },
        seq=300,
        chunks=[129, 127, 44],
        decode_from=250,
        batch=1,
        seed=5,
        kinds={"csa", "hca"},
    ),
]


@dataclass
class Loaded:
    case: Case
    ours: DeepseekV4ForCausalLM
    ops: RecordingBackend
    ids: Tensor
    ref: Tensor


@pytest.fixture(scope="module", params=CASES, ids=lambda c: c.name)
def loaded(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Loaded:
    case: Case = request.param
    torch.set_num_threads(1)
    hf = build_hf(case.seed, **case.overrides)
    out: Path = tmp_path_factory.mktemp(case.name)
    # Small shards so the index file and several shards are exercised.
    load_export_tool().export_model(hf, out, max_shard_bytes=1 << 20)
    ops = RecordingBackend()
    ours = load_model(out, dtype=torch.float32, device="cpu", backend=ops)
    gen = torch.Generator().manual_seed(case.seed + 100)
    ids = torch.randint(0, hf.config.vocab_size, (case.batch, case.seq), generator=gen)
    with torch.no_grad():
        ref = hf(ids).logits.float()
    return Loaded(case, ours, ops, ids, ref)


def test_schedule_covers_the_case(loaded: Loaded) -> None:
    assert set(loaded.ours.cfg.attn_kinds[: loaded.ours.cfg.num_hidden_layers]) == (
        loaded.case.kinds
    )


def test_full_forward_matches_transformers(loaded: Loaded) -> None:
    got = loaded.ours.forward_logits(loaded.ids)
    assert got.shape == loaded.ref.shape and got.dtype == torch.float32
    err = (got - loaded.ref).abs().max().item()
    assert err < TOL, f"max abs diff {err:.3g}"
    assert loaded.ops.clamp_fired, "the SwiGLU clamp never fired: the test would not cover it"
    assert loaded.ops.sink_used
    if "csa" in loaded.case.kinds:
        assert loaded.ops.topk_dropped, "the indexer never had to drop entries"


def test_forward_logits_in_fixed_chunks_matches_transformers(loaded: Loaded) -> None:
    got = loaded.ours.forward_logits(loaded.ids, chunk_size=17)
    err = (got - loaded.ref).abs().max().item()
    assert err < TOL, f"max abs diff {err:.3g}"


def test_chunked_prefill_matches_transformers(loaded: Loaded) -> None:
    state = loaded.ours.new_state(loaded.case.batch)
    outs, pos = [], 0
    for n in loaded.case.chunks:
        outs.append(loaded.ours.step(loaded.ids[:, pos : pos + n], state))
        pos += n
    assert pos == loaded.case.seq and state.pos == pos
    err = (torch.cat(outs, dim=1) - loaded.ref).abs().max().item()
    assert err < TOL, f"max abs diff {err:.3g}"


def test_token_by_token_decode_matches_transformers(loaded: Loaded) -> None:
    state = loaded.ours.new_state(loaded.case.batch)
    start = loaded.case.decode_from
    outs = [loaded.ours.step(loaded.ids[:, :start], state)] if start else []
    outs += [
        loaded.ours.step(loaded.ids[:, t : t + 1], state) for t in range(start, loaded.case.seq)
    ]
    err = (torch.cat(outs, dim=1) - loaded.ref).abs().max().item()
    assert err < TOL, f"max abs diff {err:.3g}"


def test_cloned_state_branches_independently(loaded: Loaded) -> None:
    """A clone taken mid-sequence continues like the original; neither disturbs the other."""
    ours, ids, ref = loaded.ours, loaded.ids, loaded.ref
    split = loaded.case.seq // 2
    state = ours.new_state(loaded.case.batch)
    head = ours.step(ids[:, :split], state)
    branch = clone_state(state)
    other = torch.randint(0, ours.cfg.vocab_size, ids[:, split:].shape)
    ours.step(other, state)  # the original wanders off on different tokens
    tail = ours.step(ids[:, split:], branch)
    err = (torch.cat((head, tail), dim=1) - ref).abs().max().item()
    assert err < TOL, f"max abs diff {err:.3g}"
