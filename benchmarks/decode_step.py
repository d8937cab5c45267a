"""Batched decode step time vs batch size, and the batched paths' agreement with per-sequence runs.

For the random-weight V4 tiny model and the embedded V4.1 tiny model, in fp32 and bf16:

* packed prefill rounds and decode steps of six sequences against one ``forward`` per sequence
  (max |logit difference|), and a rollback loop against recomputation from scratch;
* the median wall time of one ``forward_decode`` step with B = 1, 32, 128 sequences that each
  prefilled 64 tokens (CUDA-synchronised on the GPU), with states of their own, as rows of
  shared slot tensors (the engine's layout), and, where the backend allows, through CUDA graphs.

A step that costs the same at every B is launch/overhead bound; growth with B is work done per
row. Results go to ``benchmarks/results/decode_step_<device>.json``.

    python benchmarks/decode_step.py [--device cuda --backend sm100]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from _results import write_result

from deepinfer import plugins
from deepinfer.assets import random_tiny_model, tiny_model
from deepinfer.cache.slots import StateSlots
from deepinfer.models.batch import ForwardBatch
from deepinfer.models.deepseek_v4 import DeepseekV4ForCausalLM
from deepinfer.models.graphs import DecodeGraphs


def agreement(m: DeepseekV4ForCausalLM, top: int, g: torch.Generator, dev: str) -> float:
    n = 6
    sep = [m.new_state(1) for _ in range(n)]
    bat = [m.new_state(1) for _ in range(n)]
    worst = 0.0
    for _ in range(4):
        lengths = torch.randint(1, 90, (n,), generator=g).tolist()
        chunks = [torch.randint(3, top, (k,), generator=g).to(dev) for k in lengths]
        want = torch.stack([m.step(c[None], sep[i])[0, -1] for i, c in enumerate(chunks)])
        worst = max(worst, float((want - m(ForwardBatch.build(chunks, bat)).logits).abs().max()))
        for _ in range(10):
            ids = torch.randint(3, top, (n,), generator=g).to(dev)
            want = torch.stack([m.step(ids[i].view(1, 1), sep[i])[0, 0] for i in range(n)])
            worst = max(worst, float((want - m(ForwardBatch.decode(ids, bat)).logits).abs().max()))
    return worst


def rollback_error(m: DeepseekV4ForCausalLM, top: int, g: torch.Generator, dev: str) -> float:
    state, tokens, worst = m.new_state(1, slack=5), [], 0.0
    for step in range(40):
        k = int(torch.randint(1, 7, (1,), generator=g))
        new = torch.randint(3, top, (k,), generator=g).tolist()
        logits = m.step(torch.tensor([new], device=dev), state)[0, -1]
        tokens += new
        if step % 5 == 0:
            ref = m.forward_logits(torch.tensor([tokens], device=dev))[0, -1]
            worst = max(worst, float((ref - logits).abs().max()))
        back = int(torch.randint(0, min(5, len(tokens) - state.committed) + 1, (1,), generator=g))
        if back:
            tokens = tokens[:-back]
            m.rollback(state, len(tokens), tokens)
    return worst


def step_ms(
    m: DeepseekV4ForCausalLM, top: int, g: torch.Generator, dev: str, b: int, *, layout: str
) -> float:
    """Median step time with the states ``layout``: ``per_row`` (states of their own),
    ``slots`` (rows of shared slot tensors, as the engine keeps them) or ``slots_graph`` (the
    same, decoded through CUDA graphs); ``per_row`` states run as one-token packed spans."""
    if layout == "per_row":
        states = [m.new_state(1) for _ in range(b)]
    else:
        slots = StateSlots(lambda: m.new_state(1), max_slots=b, max_len=4096, initial_slots=b)
        states = [slots.new_state() for _ in range(b)]
    graphs = DecodeGraphs(b) if layout == "slots_graph" else None
    m(
        ForwardBatch.build(
            [torch.randint(3, top, (64,), generator=g).to(dev) for _ in range(b)], states
        )
    )
    times = []
    for _ in range(15):
        ids = torch.randint(3, top, (b,), generator=g).to(dev)
        if dev != "cpu":
            torch.cuda.synchronize()
        start = time.perf_counter()
        m(ForwardBatch.decode(ids, states), graphs)
        if dev != "cpu":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return round(statistics.median(times[3:]) * 1e3, 2)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 32, 128])
    ap.add_argument("--backend", default="torch", help="op table: torch, or sm100 on a GPU")
    ap.add_argument("--models", nargs="+", default=["v4", "v41"])
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    dev = args.device
    ops = plugins.backends.load(args.backend)(dev)
    layouts = ["per_row", "slots"]
    if ops.supports_cuda_graphs(torch.float32) and dev != "cpu":
        layouts.append("slots_graph")
    builders: dict[str, Callable[[torch.dtype], DeepseekV4ForCausalLM]] = {
        "v4": lambda dt: random_tiny_model(dt, device=dev, seed=3),
        "v41": lambda dt: tiny_model(dt, device=dev),
    }
    result: dict[str, object] = {"device": dev, "torch": torch.__version__, "backend": args.backend}
    for name in args.models:
        build = builders[name]
        for dt in (getattr(torch, d) for d in args.dtypes):
            m = build(dt)
            m.ops = ops
            top = min(m.cfg.vocab_size, m.cfg.image_token_id or m.cfg.vocab_size)
            g = torch.Generator().manual_seed(0)
            key = f"{name}_{str(dt).removeprefix('torch.')}"
            result[f"{key}_batched_max_abs_diff"] = agreement(m, top, g, dev)
            result[f"{key}_rollback_max_abs_diff"] = rollback_error(m, top, g, dev)
            for b in args.batches:
                for layout in layouts:
                    ms = step_ms(m, top, g, dev, b, layout=layout)
                    result[f"{key}_decode_step_ms_B{b}_{layout}"] = ms
            print(key, {k: v for k, v in result.items() if k.startswith(key)}, flush=True)
    write_result(result, args.out, f"decode_step_{dev.split(':')[0]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
