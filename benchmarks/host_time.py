"""Host time against wall time of config A's prefill and decode steps: is a step bound by the
host issuing its kernels, or by the GPU running them?

Config A (bf16, random weights, the ``sm100`` backend, built as ``model_speed.py`` builds it):

* prefill: one ``--prefill-len`` prompt as one chunk from a fresh state. ``issue_ms`` is the
  time until the Python call returns (every kernel queued: the forward has no host sync),
  ``wall_ms`` until the GPU is done. Where the two are equal the GPU waits on the host.
* decode, at each of ``--batches`` (rows that prefilled 512 tokens, in slot tensors): the same
  two figures for a step replayed from its CUDA graph and for the same step run eagerly, and
  the first call of a fresh graph set (its capture, warm-ups included); with
  ``--capture-warmups 2 1 2 1`` that first call again under each of those warm-up counts, in turn.
* ``--cprofile``: the functions taking the most host time in each (cProfile, by own time and
  by cumulative time), as text in the JSON.

    python benchmarks/host_time.py [--prefill-len 4096] [--batches 1 64] [--cprofile] [--out PATH]
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import pstats
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from _results import write_result
from model_speed import hold_as_checkpoint
from step_ab import midsize_config, pick_api, prefill_fresh, prefill_slots, small_config, sync

from deepinfer import plugins
from deepinfer.assets import init_random_weights
from deepinfer.cache.slots import StateSlots
from deepinfer.models.deepseek_v4 import DeepseekV4ForCausalLM
from deepinfer.models.graphs import DecodeGraphs

DECODE_PROMPT = 512


def issue_and_wall(call: Callable[[], object], device: str, repeats: int) -> dict[str, float]:
    """Median ms until ``call`` returns and until the device is done, after a warm-up."""
    call()
    issued, walls = [], []
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        call()
        issued.append(time.perf_counter() - start)
        sync(device)
        walls.append(time.perf_counter() - start)
    issue, wall = statistics.median(issued) * 1e3, statistics.median(walls) * 1e3
    return {
        "issue_ms": round(issue, 3),
        "wall_ms": round(wall, 3),
        "issue_share": round(issue / wall, 3),
    }


def profiled(call: Callable[[], object], device: str, lines: int = 30, warm: bool = True) -> str:
    """cProfile of one call (after an unprofiled one, with ``warm``): the top functions by
    own time, then by cumulative time."""
    if warm:
        call()
    sync(device)
    prof = cProfile.Profile()
    prof.enable()
    call()
    prof.disable()
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out)
    stats.sort_stats("tottime").print_stats(lines)
    stats.sort_stats("cumulative").print_stats(lines)
    return out.getvalue()


def decode_rows(
    model: DeepseekV4ForCausalLM, args: argparse.Namespace, batch: int
) -> dict[str, Any]:
    """Graphed and eager decode steps of ``batch`` rows, and a fresh graph set's first call."""
    api, device, top = pick_api(model, "new"), args.device, args.top
    slots = StateSlots(
        lambda: model.new_state(1),
        max_slots=batch,
        max_len=DECODE_PROMPT + 64,
        initial_slots=batch,
        initial_pages=batch * 8,
    )
    states = [slots.new_state() for _ in range(batch)]
    prompts = [torch.randint(3, top, (DECODE_PROMPT,), device=device) for _ in states]
    api.prefill(model, prompts, states)
    ids = torch.randint(3, top, (batch,), device=device)
    out: dict[str, Any] = {"batch": batch}
    graphed = device.startswith("cuda") and model.ops.supports_cuda_graphs(model.dtype)
    for name, graphs in (("graphed", DecodeGraphs(batch) if graphed else None), ("eager", None)):
        if name == "graphed" and graphs is None:
            continue
        step = lambda graphs=graphs: api.decode_step(model, ids, states, graphs)  # noqa: E731
        out[name] = issue_and_wall(step, device, args.repeats)
        if args.cprofile:
            out[name]["cprofile"] = profiled(step, device)
    if graphed:
        fresh = lambda g: api.decode_step(model, ids, states, g)  # noqa: E731
        out["first_call_with_capture_ms"] = first_call_ms(fresh, batch, device)
        by_warmups: dict[int, list[float]] = {}
        for n in args.capture_warmups or []:  # alternated, as given
            with capture_warmups(n):
                by_warmups.setdefault(n, []).append(first_call_ms(fresh, batch, device))
        if by_warmups:
            out["first_call_ms_by_capture_warmups"] = by_warmups
    return out


def first_call_ms(step: Callable[[DecodeGraphs], object], batch: int, device: str) -> float:
    """Milliseconds of a decode step through a fresh graph set: its capture, warm-ups included."""
    sync(device)
    start = time.perf_counter()
    step(DecodeGraphs(batch))
    sync(device)
    return round((time.perf_counter() - start) * 1e3, 1)


@contextlib.contextmanager
def capture_warmups(n: int) -> Iterator[None]:
    """``graphs.CAPTURE_WARMUPS`` set to ``n`` while inside."""
    from deepinfer.models import graphs

    kept, graphs.CAPTURE_WARMUPS = graphs.CAPTURE_WARMUPS, n
    try:
        yield
    finally:
        graphs.CAPTURE_WARMUPS = kept


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--small", action="store_true", help="tiny shapes: a CPU check")
    ap.add_argument("--prefill-len", type=int, default=4096)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 64])
    ap.add_argument(
        "--capture-warmups", type=int, nargs="+", default=None,
        help="also time a fresh graph set's first call under these CAPTURE_WARMUPS, in turn",
    )  # fmt: skip
    ap.add_argument(
        "--prefill-state", choices=("slot", "own"), default="slot",
        help="a slot state with paged entries, as the engine's, or the model's own new_state",
    )  # fmt: skip
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--cprofile", action="store_true")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    backend = "sm100" if args.device.startswith("cuda") else "torch"
    cfg = small_config() if args.small else midsize_config()
    ops = plugins.backends.load(backend)(args.device)
    model = DeepseekV4ForCausalLM(cfg, dtype=torch.bfloat16, device=args.device, backend=ops)
    init_random_weights(model, seed=0)
    hold_as_checkpoint(model)
    model.eval()
    args.top = min(cfg.vocab_size, cfg.image_token_id or cfg.vocab_size)
    api = pick_api(model, "new")
    ids = torch.randint(3, args.top, (args.prefill_len,), device=args.device)

    slots = prefill_slots(model, args.prefill_len) if args.prefill_state == "slot" else None

    def prefill() -> None:  # from a fresh state each call
        prefill_fresh(model, api, ids, slots)

    with torch.inference_mode():
        prefill_row: dict[str, Any] = {
            "tokens": args.prefill_len,
            "state": args.prefill_state,
            **issue_and_wall(prefill, args.device, args.repeats),
        }
        if args.cprofile:
            prefill_row["cprofile"] = profiled(prefill, args.device)
        decode = [decode_rows(model, args, batch) for batch in args.batches]
    result = {
        "benchmark": "host_time",
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
        "backend": backend,
        "model": "config A (shrunk)" if args.small else "config A",
        "args": {k: v for k, v in vars(args).items() if k not in {"out", "top"}},
        "prefill": prefill_row,
        "decode": decode,
    }
    print({k: v for k, v in prefill_row.items() if k != "cprofile"}, file=sys.stderr)
    for row in decode:
        print({k: {m: x for m, x in v.items() if m != "cprofile"} if isinstance(v, dict) else v
               for k, v in row.items()}, file=sys.stderr)  # fmt: skip
    name = "host_time_" + (result["device"].split()[1].lower() if backend == "sm100" else "cpu")
    write_result(result, args.out, name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
