"""Where an engine step's wall time goes: scheduling, the model, sampling, token bookkeeping.

For the embedded tiny model (V4.1) and the random tiny V4 of ``offline_throughput.py``, runs
``LLM.generate`` of B equal-length random prompts (greedy, fixed output length) once plainly
and once with each phase timed (on a GPU, synchronised before and after the model and the
sampler, so the GPU time lands in the phase that queued it). Reported per engine step:
``plain_ms_per_step`` (unsynchronised, with the engine's default scheduling: asynchronous on a
GPU), ``sync_plain_ms_per_step`` (the same with ``async_scheduling`` off), and, timed on the
synchronous engine, ``schedule``, ``execute`` (the step's batch, the model and block
recording), ``forward`` (the model's one forward, prefill included), ``sample`` and ``append``
(detokenising, stop checks). ``execute - forward`` is the runner's own host work.

    python benchmarks/engine_phases.py [--device cuda] [--batches 1 32 128]
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from _results import write_result

from deepinfer import LLM, SamplingParams

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))


def profile(llm: LLM, batch: int, vocab_top: int, output_len: int) -> dict[str, Any]:
    eng = llm.engine
    cuda = eng.model.device.type == "cuda"
    sync: Callable[[], None] = torch.cuda.synchronize if cuda else (lambda: None)
    spent: dict[str, float] = collections.defaultdict(float)
    g = torch.Generator().manual_seed(batch)
    prompts = [torch.randint(3, vocab_top, (64,), generator=g).tolist() for _ in range(batch)]
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    llm.generate(prompts, params, use_tqdm=False)  # warm-up (graph capture)
    default = eng.async_scheduling
    plain = {}
    for overlap in (default, False):
        eng.async_scheduling = overlap
        start = time.perf_counter()
        steps0 = eng.num_steps
        llm.generate(prompts, params, use_tqdm=False)
        plain[overlap] = (time.perf_counter() - start) / (eng.num_steps - steps0)
    phases = [
        (eng.scheduler, "schedule", False),
        (eng.runner, "execute", True),
        (eng.runner, "launch_sample", True),
        (eng, "_append", False),
        (eng.model, "forward", True),
    ]
    for obj, name, synced in phases:
        label = {"launch_sample": "sample"}.get(name, name.strip("_"))
        setattr(obj, name, _timed(getattr(obj, name), label, spent, sync, synced))
    steps0 = eng.num_steps
    try:
        llm.generate(prompts, params, use_tqdm=False)
    finally:
        for obj, name, _ in phases:
            delattr(obj, name)  # back to the class's method
        eng.async_scheduling = default
    steps = eng.num_steps - steps0
    return {
        "batch": batch,
        "steps": steps,
        "async_scheduling": default,
        "plain_ms_per_step": round(plain[default] * 1e3, 3),
        "sync_plain_ms_per_step": round(plain[False] * 1e3, 3),
        **{f"{k}_ms_per_step": round(v / steps * 1e3, 3) for k, v in spent.items()},
    }


def _timed(
    fn: Callable[..., Any],
    label: str,
    spent: dict[str, float],
    sync: Callable[[], None],
    synced: bool,
) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if synced:
            sync()
        start = time.perf_counter()
        out = fn(*args, **kwargs)
        if synced:
            sync()
        spent[label] += time.perf_counter() - start
        return out

    return wrapper


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 32, 128])
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    import offline_throughput

    rows: dict[str, Any] = {}
    tiny = LLM("tiny", device=args.device, dtype="float32", seed=0, enable_prefix_caching=False)
    cfg = tiny.engine.model.cfg
    top = min(cfg.vocab_size, cfg.image_token_id or cfg.vocab_size)
    for b in args.batches:
        rows[f"tiny_B{b}"] = profile(tiny, b, top, args.output_len)
        print(rows[f"tiny_B{b}"])
    _, v4 = offline_throughput.build(Path(tempfile.mkdtemp()), args.device)
    for b in args.batches:
        rows[f"v4_B{b}"] = profile(v4, b, 8000, args.output_len)
        print(rows[f"v4_B{b}"])
    result = {
        "benchmark": "engine_phases",
        "device": args.device,
        "torch": torch.__version__,
        "output_len": args.output_len,
        "rows": rows,
    }
    write_result(result, args.out, f"engine_phases_{args.device.split(':')[0]}")


if __name__ == "__main__":
    main()
