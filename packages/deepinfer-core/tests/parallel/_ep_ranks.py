"""What the expert-parallel tests run on every rank, and the guard that starts the ranks.

A rank process imports this module by name (``torch.multiprocessing`` pickles the function by
module and name), so it lives on the sys.path conftest sets up rather than in a test file.
Each rank builds the same seeded layers and models as the test process, holds only its expert
shard, runs its own tokens through them and saves what came out for the test to compare.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from deepinfer.assets import TINY_DIR, load_checkpoint, random_tiny_model, tiny_config
from deepinfer.backends.torch_ref import TorchBackend
from deepinfer.config import ModelConfig
from deepinfer.models.expert_shard import shard_routed_experts
from deepinfer.models.layers.moe import MoE
from deepinfer.parallel import ExpertParallel, init_expert_parallel
from deepinfer.parallel.expert_parallel import GATHER_MAX_TOKENS

#: MoE layers of the layer test: learned routing, hash routing (by token id), FP4 experts.
LAYER_KINDS = ("learned", "hashed", "fp4")
#: Tokens per rank in the layer test (a rank with none among them), by world size.
LAYER_TOKENS = {1: [6], 2: [6, 0], 4: [5, 0, 9, 2]}
#: Prompt length of each rank in the model tests.
PROMPT_LENGTHS = [7, 12, 3, 17]
COLLECTIVE_TIMEOUT_S = 60.0


def layer_config() -> ModelConfig:
    """The tiny V4 config: 8 routed experts, top 2, hidden and expert widths 64, layer 0
    hash-routed."""
    return tiny_config()


@torch.no_grad()
def moe_layer(kind: str, seed: int = 0) -> MoE:
    """A seeded MoE layer of ``kind`` holding every routed expert (as a single process does)."""
    cfg = layer_config()
    moe = MoE(cfg, layer_id=0 if kind == "hashed" else 1, dtype=torch.float32)
    if kind == "fp4":
        moe.experts.hold_fp4(32)
    g = torch.Generator().manual_seed(seed)
    for name, t in moe.state_dict(keep_vars=True).items():
        if name == "gate.tid2eid":  # distinct experts per token
            noise = torch.rand(t.shape[0], cfg.n_routed_experts, generator=g)
            t.copy_(noise.argsort(dim=-1)[:, : t.shape[1]])
        elif t.dtype == torch.uint8 and name.endswith(".scale"):
            t.fill_(122)  # 2**-5: e2m1 codes (up to 6) at about 1 / sqrt(fan-in)
        elif t.dtype == torch.uint8:
            t.copy_(torch.randint(0, 256, t.shape, generator=g, dtype=torch.uint8))
        elif t.dim() == 2:
            t.normal_(0.0, t.shape[1] ** -0.5, generator=g)
        else:
            t.normal_(0.0, 0.1, generator=g)
    return moe.eval()


def layer_tokens(rank: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s hidden states [n, d] and token ids [n] for the layer test."""
    n = LAYER_TOKENS[world][rank]
    g = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(n, layer_config().hidden_size, generator=g)
    return x, torch.randint(0, layer_config().vocab_size, (n,), generator=g)


def prompt(rank: int, cfg: ModelConfig) -> torch.Tensor:
    """Rank ``rank``'s prompt [1, S] of text ids (below any image placeholder)."""
    top = cfg.vocab_size if cfg.image_token_id is None else min(cfg.vocab_size, cfg.image_token_id)
    g = torch.Generator().manual_seed(200 + rank)
    return torch.randint(3, top, (1, PROMPT_LENGTHS[rank]), generator=g)


def v41_model(ep: ExpertParallel | None = None) -> Any:
    """The embedded trained V4.1 tiny model, read by the checkpoint loader (sharded by
    ``ep``: the rank reads only its experts' tensors)."""
    return load_checkpoint(TINY_DIR, torch.float32, "cpu", expert_parallel=ep)


@torch.no_grad()
def rank_outputs(ep: ExpertParallel) -> dict[str, Any]:
    """Everything one rank computes: each MoE layer on its tokens, then each tiny model's
    logits on its prompt, and the routed-expert stack shapes it held."""
    ops = TorchBackend("cpu")
    out: dict[str, Any] = {}
    x, ids = layer_tokens(ep.rank, ep.world_size)
    for kind in LAYER_KINDS:
        moe = moe_layer(kind)
        shard_routed_experts(moe, ep)
        out[f"layer.{kind}"] = moe(ops, x, ids)  # the all-to-all
        ep.step.rows = max(LAYER_TOKENS[ep.world_size])  # the fixed-shape exchange
        out[f"layer.{kind}.fixed"] = moe(ops, x, ids)
        ep.step.rows = None
        out[f"shape.{kind}"] = tuple(moe.experts.w13.shape)
    agreed = []
    for tokens in (ep.rank + 1, GATHER_MAX_TOKENS + ep.rank):  # the most over the ranks
        ep.agree(tokens)
        agreed.append(ep.step.rows)
    out["agreed"] = agreed
    ep.step.rows = None
    out["captures"] = capture_rounds(ep)
    v4 = random_tiny_model(torch.float32, seed=0)
    shard_routed_experts(v4, ep)
    out["v4"] = v4.forward_logits(prompt(ep.rank, v4.cfg))
    v41 = v41_model(ep)
    out["v41"] = v41.forward_logits(prompt(ep.rank, v41.cfg))
    out["shape.v41"] = tuple(v41.layers[0].ffn.experts.w13.shape)
    return out


#: Decode graphs each rank's steps wanted (key, bucket), by rank: ranks want different
#: buckets, two want one of the same, a rank wants nothing.
WANTED = {0: [("a", 8), ("b", 16)], 1: [("c", 16)], 2: [], 3: [("d", 4)]}


def capture_rounds(ep: ExpertParallel) -> dict[str, Any]:
    """``DecodeGraphs.capture_wanted`` with this rank's :data:`WANTED` graphs, its capture
    replaced by the warm-ups alone (no GPU here): each warm-up and each partner forward is one
    SUM all-reduce of a one, so a collective that lost its partner pairs with another kind (the
    agreement's MAX) and shows up in the sums, or never returns. Returns the graphs this rank
    captured in order, the rows each saw, and every sum."""
    from deepinfer.models.graphs import CAPTURE_WARMUPS, DecodeGraphs

    graphs = DecodeGraphs(16)
    graphs.expert_parallel = ep
    graphs.capture_on_use = False
    sums: list[int] = []

    def collective() -> None:  # stands for a forward through the MoE layers
        one = torch.ones(1)
        dist.all_reduce(one, group=ep.group)
        sums.append(int(one[0]))

    captured: list[tuple[str, int, int | None]] = []

    def capture(key: Any, bucket: int, fn: Any, inputs: Any) -> None:
        for _ in range(CAPTURE_WARMUPS):
            fn()
        captured.append((key, bucket, ep.step.rows))

    graphs._capture = capture  # type: ignore[method-assign]
    for key, bucket in WANTED.get(ep.rank, []):
        graphs._wanted[key, bucket] = (collective, ())
    n = graphs.capture_wanted(collective)
    return {"captured": captured, "count": n, "sums": sums, "rows_after": ep.step.rows}


def rank_main(rank: int, world: int, store: str, out_dir: str) -> None:
    """One rank: join the group through the file store, compute, save, leave the group."""
    torch.set_num_threads(1)
    ep = init_expert_parallel(
        torch.device("cpu"),
        rank=rank,
        world_size=world,
        init_method=f"file://{store}",
        timeout_s=COLLECTIVE_TIMEOUT_S,
    )
    try:
        torch.save(rank_outputs(ep), Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def run_ranks(world: int, work_dir: Path, timeout_s: float = 240.0) -> list[dict[str, Any]]:
    """Start ``world`` rank processes, wait for them (at most ``timeout_s``) and return what
    each saved. A rank that fails ends the others (``torch.multiprocessing`` does so on
    join); one that hangs past the deadline is killed with the rest, so no process outlives
    the test."""
    store = work_dir / "store"
    context = mp.start_processes(
        rank_main,
        args=(world, str(store), str(work_dir)),
        nprocs=world,
        join=False,
        start_method="spawn",
    )
    deadline = time.monotonic() + timeout_s
    try:
        while not context.join(timeout=0.5):
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{world} expert-parallel ranks still running after {timeout_s}s"
                )
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
            process.join()
    return [torch.load(work_dir / f"rank{r}.pt") for r in range(world)]
