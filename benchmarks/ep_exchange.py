"""One MoE layer's expert-parallel exchange on GPUs (NCCL): both exchanges against the plain
local experts, eager and in a CUDA graph.

Every rank holds ``--experts / world`` of a layer's bf16 routed experts (hidden ``--hidden``,
width ``--inter``, top ``--topk``) and routes its own ``T`` random tokens; per token count T:

* equality: the all-to-all and the fixed-shape exchange
  (:func:`~deepinfer.parallel.dispatch_experts`) against the same experts run on every rank's
  tokens in one process (world size 1: the rank's own local experts), max abs difference and
  whether bitwise equal;
* capture: the fixed-shape exchange in a CUDA graph, replayed on new inputs, against the eager
  exchange on them;
* time (median microseconds, synchronised around each call): the local experts alone, the
  all-to-all, the fixed-shape exchange, each graphed where it can be (the all-to-all cannot:
  it reads counts on the host), and the host-side agreement (``ExpertParallel.agree``);
* bytes each rank sends per layer through either exchange.

World size 1 runs without ``torchrun`` (a 1-rank NCCL group: the exchanges' collectives on one
GPU, what they cost beyond the experts); more ranks with it:

    python benchmarks/ep_exchange.py [--tokens 1 8 64 256] [--out path.json]
    torchrun --nproc-per-node 2 benchmarks/ep_exchange.py --out path.json
"""

from __future__ import annotations

import argparse
import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from _results import write_result
from low_precision import median_s
from torch import Tensor

from deepinfer.parallel import ExpertParallel, dispatch_experts
from deepinfer_kernels_sm100.backend import Sm100Backend


def median_us(fn: Callable[[], object]) -> float:
    """Median microseconds of ``fn()`` between device syncs (``low_precision.median_s``)."""
    return median_s(fn, "cuda", 50) * 1e6


def graphed(fn: Callable[[], Tensor]) -> tuple[torch.cuda.CUDAGraph, Tensor]:
    """``fn`` captured (after warm-up on a side stream) and its static output."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


def routed(n: int, args: argparse.Namespace, seed: int) -> tuple[Tensor, Tensor, Tensor]:
    """(tokens [n, d] bf16, router weights [n, k], distinct global experts [n, k])."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(n, args.hidden, device="cuda", generator=g).bfloat16()
    weights = torch.rand(n, args.topk, device="cuda", generator=g)
    noise = torch.rand(n, args.experts, device="cuda", generator=g)
    return x, weights, noise.argsort(-1)[:, : args.topk]


@dataclass
class Layer:
    """One MoE layer's routed experts: the rank's shard and (for the reference) all of them."""

    ep: ExpertParallel
    ops: Sm100Backend
    w13: Tensor
    w2: Tensor

    def __post_init__(self) -> None:
        self.shard = self.ep.shard(self.w13.shape[0])

    def local(self, x: Tensor, w: Tensor, idx: Tensor) -> Tensor:
        """The rank's own experts on received pairs (local expert ids)."""
        first, stop = self.shard.first, self.shard.stop
        return self.ops.moe_experts(
            x, w, idx, w13=self.w13[first:stop], w2=self.w2[first:stop], swiglu_limit=10.0
        )

    def whole(self, x: Tensor, w: Tensor, idx: Tensor) -> Tensor:
        """Every expert in this process: what the exchange must give."""
        return self.ops.moe_experts(x, w, idx, w13=self.w13, w2=self.w2, swiglu_limit=10.0)

    def exchange(self, x: Tensor, w: Tensor, idx: Tensor) -> Tensor:
        return dispatch_experts(
            self.ep, self.shard, x, weights=w, indices=idx, local_experts=self.local
        )


def measure(layer: Layer, n: int, args: argparse.Namespace) -> dict[str, Any]:
    """Equality, capture, times and bytes at ``n`` tokens a rank (see the module)."""
    ep = layer.ep
    x, w, idx = routed(n, args, seed=1000 * ep.rank + n)
    want = layer.whole(x, w, idx)
    ep.step.rows = None
    a2a = layer.exchange(x, w, idx)
    ep.agree(n)
    rows = ep.step.rows
    assert rows is not None, f"{n} tokens exceed the fixed-shape exchange"
    fixed = layer.exchange(x, w, idx)
    row: dict[str, Any] = {
        "rows": rows,
        "a2a_max_abs": float((a2a - want).abs().max()),
        "a2a_bitwise": bool(torch.equal(a2a, want)),
        "fixed_max_abs": float((fixed - want).abs().max()),
        "fixed_bitwise": bool(torch.equal(fixed, want)),
    }
    static = tuple(t.clone() for t in (x, w, idx))
    graph, out = graphed(functools.partial(layer.exchange, *static))
    fresh = routed(n, args, seed=7 + 1000 * ep.rank + n)
    for dst, src in zip(static, fresh, strict=True):
        dst.copy_(src)
    graph.replay()
    row["graph_equals_eager"] = bool(torch.equal(out, layer.exchange(*fresh)))
    row["us_graph_fixed"] = median_us(graph.replay)
    local_graph, _ = graphed(functools.partial(layer.local, *static))
    row["us_graph_local"] = median_us(local_graph.replay)
    row["us_eager_local"] = median_us(functools.partial(layer.local, x, w, idx))
    row["us_eager_fixed"] = median_us(functools.partial(layer.exchange, x, w, idx))
    ep.step.rows = None
    row["us_eager_a2a"] = median_us(functools.partial(layer.exchange, x, w, idx))
    row["us_agree"] = median_us(functools.partial(ep.agree, n))
    world, d, k = ep.world_size, args.hidden, args.topk
    # fixed: inputs (bf16) and routing (int32 id + fp32 weight per slot) gathered, per-pair
    # fp32 outputs reduce-scattered; all-to-all: the pairs owned elsewhere, out and back
    row["fixed_bytes_sent"] = (world - 1) * rows * (2 * d + 8 * k + 4 * k * d)
    away = int(((idx < layer.shard.first) | (idx >= layer.shard.stop)).sum())
    row["a2a_bytes_sent"] = away * (2 * d + 8 + 4 * d)
    return row


def run(args: argparse.Namespace, ep: ExpertParallel) -> dict[str, Any]:
    """Every token count of ``--tokens`` on one layer drawn alike on every rank."""
    g = torch.Generator(device="cuda").manual_seed(0)
    shape13 = (args.experts, 2 * args.inter, args.hidden)
    w13 = torch.randn(shape13, device="cuda", generator=g) * 0.02
    w2 = torch.randn(args.experts, args.hidden, args.inter, device="cuda", generator=g) * 0.02
    ops = Sm100Backend(torch.device("cuda", torch.cuda.current_device()))
    layer = Layer(ep, ops, w13.bfloat16(), w2.bfloat16())
    out: dict[str, Any] = {}
    for n in args.tokens:
        out[str(n)] = row = measure(layer, n, args)
        if ep.rank == 0:
            print(n, {k: round(v, 1) if isinstance(v, float) else v for k, v in row.items()})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 8, 64, 256])
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--inter", type=int, default=1408)
    parser.add_argument("--experts", type=int, default=64)
    parser.add_argument("--topk", type=int, default=6)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("ep_exchange.py measures NCCL exchanges: it needs CUDA")
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    torch.cuda.set_device(device)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=device)
    # ExpertParallel itself would make a world of 1 the single-process path: name the group
    ep = ExpertParallel(rank, world, dist.group.WORLD, dist.new_group(backend="gloo"))
    try:
        results = run(args, ep)
    finally:
        dist.destroy_process_group()
    if rank == 0:
        result = {
            "benchmark": "ep_exchange",
            "world_size": world,
            "device_name": torch.cuda.get_device_name(),
            "torch": torch.__version__,
            "shapes": {k: getattr(args, k) for k in ("hidden", "inter", "experts", "topk")},
            "tokens": results,
        }
        write_result(result, args.out, f"ep_exchange_h200_{world}rank")


if __name__ == "__main__":
    main()
