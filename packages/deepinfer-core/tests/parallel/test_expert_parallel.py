"""MoE expert parallelism on the CPU with gloo: 2 and 4 rank processes against one process.

Each world size starts its ranks once (``ranks``): every rank runs the MoE layers on its own
tokens (different counts, one rank with none) and the tiny V4 and V4.1 models on its own prompt
(different lengths), holding only its shard of the routed experts. The tests compare what each
rank saved with the single-process layer or model on that rank's input. The rest needs no
process group: the world of one, the shard arithmetic, and what a sharded rank loads or draws.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from _ep_ranks import (
    LAYER_KINDS,
    layer_tokens,
    moe_layer,
    prompt,
    run_ranks,
    v41_model,
)
from torch import Tensor

from deepinfer.assets import random_tiny_model, tiny_config
from deepinfer.backends.fp4_ref import dequant_fp4
from deepinfer.backends.torch_ref import TorchBackend
from deepinfer.models import loader
from deepinfer.models.dummy_weights import dummy_model
from deepinfer.models.expert_shard import shard_routed_experts
from deepinfer.models.layers.moe import MoE
from deepinfer.parallel import ExpertParallel, ExpertShard, init_expert_parallel

OPS = TorchBackend("cpu")
U32 = 2.0**-24  # fp32 unit roundoff
SILU_SLOPE = 1.1  # bound on |silu'|
#: Largest logit difference allowed, relative to the largest logit: the experts' matmuls run
#: on rows batched differently per world size, and the layers carry that rounding on.
MODEL_TOLERANCE = 2e-5


@pytest.fixture(scope="module", params=[2, 4], ids=["world2", "world4"])
def ranks(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    world = request.param
    return world, run_ranks(world, tmp_path_factory.mktemp(f"ep{world}"))


@pytest.fixture(scope="module")
def single_models() -> dict[str, Any]:
    return {"v4": random_tiny_model(torch.float32, seed=0), "v41": v41_model()}


def test_graphs_wanted_are_captured_by_every_rank_together(ranks: Any) -> None:
    """Each round the ranks agree on the largest bucket wanted; the ranks wanting it capture
    (largest first, one at a time), the others partner their warm-ups one for one: every
    collective meets one of its kind (each SUM of ones is the world size) and every rank
    leaves at the same round."""
    from _ep_ranks import WANTED

    from deepinfer.models.graphs import CAPTURE_WARMUPS

    world, outs = ranks
    wanted = {r: WANTED[r] for r in range(world)}
    buckets = sorted({b for w in wanted.values() for _, b in w}, reverse=True)
    rounds = [
        b for b in buckets for _ in range(max(sum(x == b for _, x in w) for w in wanted.values()))
    ]
    for rank, out in enumerate(outs):
        got = out["captures"]
        mine = sorted(wanted[rank], key=lambda kb: -kb[1])
        assert got["captured"] == [(k, b, b) for k, b in mine]  # at its rows, largest first
        assert got["count"] == len(mine) and got["rows_after"] is None
        assert got["sums"] == [world] * (CAPTURE_WARMUPS * len(rounds))


def _gamma(n: int) -> float:
    return n * U32 / (1 - n * U32)


def _swiglu64(
    x: Tensor, w13: Tensor, w2: Tensor, limit: float, scale: Tensor
) -> tuple[Tensor, Tensor]:
    """One SwiGLU expert in fp64 on fp32 inputs ``x`` [n, d] (scaled by ``scale`` [n, 1] before
    w2, as the backend does), and a first-order bound on an fp32 evaluation's error: the
    standard gamma_n * sum|terms| of each dot product, carried through the clamped SwiGLU."""
    x, w13, w2, scale = x.double(), w13.double(), w2.double(), scale.double()
    w1, w3 = w13.chunk(2, dim=0)
    g, u = x @ w1.T, x @ w3.T
    big_g, big_u = x.abs() @ w1.abs().T, x.abs() @ w3.abs().T
    gc, uc = g.clamp(max=limit), u.clamp(-limit, limit)
    h = F.silu(gc) * uc * scale
    dh = (
        scale.abs()
        * _gamma(x.shape[1])
        * (SILU_SLOPE * big_g * uc.abs() + F.silu(gc).abs() * big_u)
    )
    dh = dh + 2 * U32 * h.abs()
    y = h @ w2.T
    return y, dh @ w2.abs().T + _gamma(h.shape[1]) * (h.abs() @ w2.abs().T)


def _layer64(moe: MoE, x: Tensor, ids: Tensor) -> tuple[Tensor, Tensor]:
    """(the layer in fp64 on the fp32 routing, the bound on an fp32 evaluation's error)."""
    cfg, gate, experts = moe.cfg, moe.gate, moe.experts
    fixed = gate.tid2eid[ids] if gate.hashed else None
    bias = None if gate.hashed else gate.bias
    weights, indices = OPS.moe_route(
        x,
        gate.weight,
        bias,
        topk=cfg.num_experts_per_tok,
        scoring_func=cfg.scoring_func,
        routed_scaling_factor=cfg.routed_scaling_factor,
        norm_topk_prob=cfg.norm_topk_prob,
        fixed_indices=fixed,
    )
    w13, w2 = experts.w13, experts.w2
    if experts.w13_scale is not None and experts.w2_scale is not None:
        w13, w2 = dequant_fp4(w13, experts.w13_scale), dequant_fp4(w2, experts.w2_scale)
    shared = moe.shared_experts
    shared_w13 = torch.cat([shared.w1.weight, shared.w3.weight])
    ones = torch.ones(x.shape[0], 1)
    total, err = _swiglu64(x, shared_w13, shared.w2.weight, cfg.swiglu_limit, ones)
    magnitude = total.abs()
    for slot in range(indices.shape[1]):
        for row, e in enumerate(indices[:, slot].tolist()):
            y, dy = _swiglu64(
                x[row : row + 1],
                w13[e],
                w2[e],
                cfg.swiglu_limit,
                weights[row : row + 1, slot : slot + 1],
            )
            total[row] += y[0]
            err[row] += dy[0]
            magnitude[row] += y[0].abs()
    k = indices.shape[1]
    return total, err + _gamma(k + 1) * magnitude + U32 * total.abs()


@pytest.mark.parametrize("exchange", ["", ".fixed"], ids=["all_to_all", "fixed_shape"])
@pytest.mark.parametrize("kind", LAYER_KINDS)
def test_moe_layer_matches_single_process(ranks: Any, kind: str, exchange: str) -> None:
    """Every rank's layer output, through either exchange (the all-to-all, or the fixed-shape
    one with every rank's tokens padded to the most any rank has), equals the single-process
    layer's on its tokens: both lie within the derived fp32 error bound of the fp64 layer
    (same routing), so the world size changes the result by reassociation at most (on this CPU
    it is bit for bit)."""
    world, outputs = ranks
    moe = moe_layer(kind)
    for rank, out in enumerate(outputs):
        x, ids = layer_tokens(rank, world)
        got = out[f"layer.{kind}{exchange}"]
        with torch.no_grad():
            single = moe(OPS, x, ids)
        assert got.shape == single.shape == x.shape
        if x.shape[0] == 0:
            continue
        ref, bound = _layer64(moe, x, ids)
        assert ((got.double() - ref).abs() <= bound).all(), (rank, kind)
        assert ((single.double() - ref).abs() <= bound).all(), (rank, kind)


def test_ranks_agree_on_the_most_tokens(ranks: Any) -> None:
    """Before a forward the ranks learn the most tokens any of them feeds it: the fixed-shape
    exchange's rows up to GATHER_MAX_TOKENS, the all-to-all (None) past it."""
    world, outputs = ranks
    for out in outputs:
        assert out["agreed"] == [world, None]


@pytest.mark.parametrize("name", ["v4", "v41"])
def test_model_logits_match_single_process(
    ranks: Any, single_models: dict[str, Any], name: str
) -> None:
    """A whole tiny V4 (hash-routed first layer) and V4.1 model: each rank's logits on its
    prompt equal the single-process model's on the same prompt, up to the reassociation of
    the experts' matmuls over differently batched rows (measured below 1e-6 of the largest
    logit), and pick the same greedy tokens."""
    world, outputs = ranks
    model = single_models[name]
    for rank, out in enumerate(outputs):
        want = model.forward_logits(prompt(rank, model.cfg))
        got = out[name]
        assert got.shape == want.shape
        scale = float(want.abs().max())
        torch.testing.assert_close(
            got, want, rtol=0, atol=MODEL_TOLERANCE * scale, msg=f"{name} rank {rank}/{world}"
        )
        assert torch.equal(got.argmax(-1), want.argmax(-1)), (name, rank)


def test_ranks_hold_their_shard(ranks: Any) -> None:
    world, outputs = ranks
    for out in outputs:
        assert out["shape.learned"][0] == out["shape.fp4"][0] == 8 // world
        assert out["shape.v41"][0] == 4 // world


def test_shard_arithmetic() -> None:
    assert ExpertParallel(1, 4).shard(8) == ExpertShard(first=2, count=2, total=8)
    assert ExpertParallel().shard(6) == ExpertShard(first=0, count=6, total=6)
    with pytest.raises(ValueError, match="cannot be split evenly over 3"):
        ExpertParallel(0, 3).shard(8)
    with pytest.raises(ValueError, match="outside a world of 2"):
        ExpertParallel(2, 2)


@torch.no_grad()
def test_world_of_one_needs_no_process_group() -> None:
    """World size 1 creates no group, keeps every expert (the same stacks) and runs the
    layer's ordinary path: the same output, bit for bit."""
    ep = init_expert_parallel(torch.device("cpu"), rank=0, world_size=1)
    assert ep == ExpertParallel() == ExpertParallel.from_torch()
    assert not dist.is_initialized()
    moe = moe_layer("hashed")
    x, ids = layer_tokens(0, 1)
    want = moe(OPS, x, ids)
    stack = moe.experts.w13
    shard_routed_experts(moe, ep)
    assert moe.experts.w13 is stack
    assert torch.equal(moe(OPS, x, ids), want)
    assert not dist.is_initialized()


def test_fp4_stacks_shard_as_slices() -> None:
    """Sharding an FP4 layer keeps its packed codes and scales (the last half of them on rank
    1 of 2), named by their global expert ids."""
    moe = moe_layer("fp4")
    full = {name: t.clone() for name, t in moe.state_dict().items()}
    shard_routed_experts(moe, ExpertParallel(1, 2))
    assert moe.experts.w13_scale is not None and moe.experts.w13.dtype == torch.uint8
    got = moe.state_dict()
    experts = {n.split(".")[1] for n in got if n.startswith("experts.")}
    assert experts == {"4", "5", "6", "7"}
    for name, t in got.items():
        assert torch.equal(t, full[name]), name


def test_rank_reads_only_its_experts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Loading rank 1 of 2 from the embedded V4.1 checkpoint reads experts 2 and 3 and no
    other rank's, holds stacks of 2, and gets the same values as a whole load."""
    read: list[str] = []
    open_shard = loader.open_shard

    class Recording:
        def __init__(self, handle: Any) -> None:
            self.handle = handle

        def get_tensor(self, name: str) -> Tensor:
            read.append(name)
            return self.handle.get_tensor(name)

    def recording_open(path: Path) -> Any:
        import contextlib

        @contextlib.contextmanager
        def opened() -> Any:
            with open_shard(path) as handle:
                yield Recording(handle)

        return opened()

    monkeypatch.setattr(loader, "open_shard", recording_open)
    sharded = v41_model(ExpertParallel(1, 2))
    monkeypatch.undo()
    experts = {n.split(".experts.")[1].split(".")[0] for n in read if ".ffn.experts." in n}
    assert experts == {"2", "3"}
    assert all(t.shape[0] == 2 for n, t in sharded.named_parameters() if n.endswith("experts.w13"))
    whole = v41_model().state_dict()
    got = sharded.state_dict()
    assert set(got) == {n for n in whole if ".experts.0." not in n and ".experts.1." not in n}
    for name, t in got.items():
        assert torch.equal(t, whole[name]), name


def test_dummy_shard_draws_the_whole_models_values(tmp_path: Path) -> None:
    """``load_format="dummy"`` on rank 2 of 4 allocates and draws only experts 4 and 5, with
    the values the whole dummy model has for them, and the same values for everything else."""
    (tmp_path / "config.json").write_text(json.dumps(tiny_config().to_dict()))
    whole = dummy_model(tmp_path, torch.float32, "cpu", seed=3).state_dict()
    sharded = dummy_model(
        tmp_path, torch.float32, "cpu", seed=3, expert_parallel=ExpertParallel(2, 4)
    )
    got = sharded.state_dict()
    experts = {n.split(".experts.")[1].split(".")[0] for n in got if ".ffn.experts." in n}
    assert experts == {"4", "5"}
    assert sharded.layers[0].ffn.experts.w13.shape[0] == 2
    for name, t in got.items():
        assert torch.equal(t, whole[name]), name
