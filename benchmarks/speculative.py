"""Speculative decoding on the embedded tiny model: output tok/s and acceptance, side by side.

Arms, each timed in this process on the same prompts (windows of the held-out plays, so the
drafter has not seen them): no speculation; MTP with k = 3 (the tiny model's own MTP layer,
chained), every draft verified or on the adaptive schedule; DSpark with every draft verified
(k = 5); DSpark with the static confidence threshold (``--threshold``); DSpark with
confidence-scheduled, load-aware verification (``scheduling: "adaptive"``: each step verifies
the drafts worth their cost on the cost table the engine profiles at start, outside the timed
run); on a GPU, also DSpark k = 5 with the drafter's rounds run eagerly (``enforce_eager``)
rather than replayed from CUDA graphs. For each batch size the engine generates
``--output-len`` greedy tokens per sequence (all submitted at once); with ``--waves w``,
``w * batch`` sequences with at most ``batch`` running at once, so a request that finishes
early (speculation keeps more of its drafts) makes room for the next, as on a server, rather
than leaving its slot idle until the batch's slowest request ends. Output
tok/s is ``sequences * output_len / wall seconds``: the median of ``--repeats`` runs of one
engine an arm (built once for every batch; an untimed first run at each batch; the arms' runs
interleaved, so the machine's drift lands on all of them; prefix caching off). tau is the mean
acceptance length over the last run: drafts kept per verification round, plus one. The
scheduled arm also records what its schedule prices a step of the batch at (``schedule_ms``),
and each speculating arm how many drafting passes its last run made (``draft_passes``: a
pass whose drafts the schedule then cut still costs its time).

    python benchmarks/speculative.py [--device cpu] [--batches 1 8 64]

Results go to ``benchmarks/results/speculative_<device>.json``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from _results import write_result

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))


def held_out_prompts(n: int, length: int) -> list[list[int]]:
    """``n`` prompts of ``length`` tokens spread over the validation plays."""
    from tiny.corpus import load_corpus
    from tiny.data import spread_windows

    from deepinfer.assets import tiny_tokenizer

    return spread_windows(tiny_tokenizer().encode(load_corpus().validation_text).ids, n, length)


def build_engine(args: argparse.Namespace, spec: dict[str, Any] | None) -> Any:
    """An engine for one arm: the tiny model in fp32 on the backend ``LLM`` would pick,
    synchronous scheduling, no prefix cache (every run computes its prompts)."""
    from deepinfer import plugins
    from deepinfer.assets import tiny_model, tiny_tokenizer
    from deepinfer.device import select_backend
    from deepinfer.engine.config import EngineConfig
    from deepinfer.engine.engine import LLMEngine

    choice = select_backend(args.device)  # as LLM picks it: sm100 on an NVIDIA GPU
    backend = plugins.backends.load(choice.backend)(choice.device)
    model = tiny_model(torch.float32, choice.device, backend)
    config = EngineConfig(
        speculative_config=spec, async_scheduling=False, enable_prefix_caching=False
    )
    return LLMEngine(model, tiny_tokenizer(), config)


def timed_run(engine: Any, prompts: list[list[int]], output_len: int) -> dict[str, Any]:
    """One run of every prompt: its seconds, speculation rounds, drafts kept (from the
    outputs' metrics) and drafts verified and accepted (the engine's counters)."""
    from deepinfer.sampling_params import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    for p in prompts:
        engine.add_request(p, params)
    spec = engine.spec
    before = (spec.num_drafts, spec.num_accepted, spec.draft_passes) if spec else (0, 0, 0)
    if engine.model.device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    done = engine.run()
    if engine.model.device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    metrics = [o.metrics for o in done.values() if o.metrics is not None]
    after = (spec.num_drafts, spec.num_accepted, spec.draft_passes) if spec else (0, 0, 0)
    return {
        "seconds": seconds,
        "rounds": sum(m.spec_rounds for m in metrics),
        "kept": sum(m.spec_accepted_tokens for m in metrics),
        "drafts": after[0] - before[0],
        "accepted": after[1] - before[1],
        "draft_passes": after[2] - before[2],
    }


def schedule_prices(verifier: Any, rows: int, k: int) -> dict[str, Any]:
    """What the adaptive schedule prices a step of ``rows`` requests at (ms): the profiled
    plain step, verification step of ``k`` drafts a row and drafting round, and the host
    work per step it learnt on top (:mod:`deepinfer.engine.step_overhead`)."""
    overhead = verifier.overhead

    def ms(seconds: float | None) -> float | None:
        return None if seconds is None else round(seconds * 1e3, 3)

    return {
        "plain": ms(verifier.cost.seconds(rows, rows)),
        "verify": ms(verifier.cost.seconds(rows, rows * (k + 1))),
        "draft": ms(verifier.draft_seconds(rows)),
        "overhead_plain": ms(overhead.plain if overhead else None),
        "overhead_round": ms(overhead.round if overhead else None),
    }


def run_batch(
    args: argparse.Namespace, prompts: list[list[int]], engines: dict[str, Any]
) -> dict[str, dict[str, Any]]:
    """Every arm's engine on ``prompts``: one untimed run each (graphs captured on first
    use, kernels compiled), then ``--repeats`` rounds of one timed run per arm in turn, so
    drift of the machine lands on every arm alike; the median run of each."""
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in engines}
    for engine in engines.values():
        timed_run(engine, prompts, args.output_len)
    for _ in range(args.repeats):
        for name, engine in engines.items():
            runs[name].append(timed_run(engine, prompts, args.output_len))
    rows = {}
    for name, engine in engines.items():
        seconds = statistics.median(r["seconds"] for r in runs[name])
        row: dict[str, Any] = {
            "output_tok_per_s": round(len(prompts) * args.output_len / seconds, 1),
            "seconds": round(seconds, 3),
        }
        last = runs[name][-1]
        if engine.spec is not None:  # the last run's
            row["drafts_verified"] = last["drafts"]
            row["draft_passes"] = last["draft_passes"]
            verifier = engine.spec.verifier
            if verifier is not None:  # drafts proposed (all runs), before the cut
                row["drafts_offered"] = verifier.offered
                row["schedule_ms"] = schedule_prices(verifier, len(prompts), engine.spec.k)
            row["drafts_kept"] = last["accepted"]
            row["tau"] = round((last["kept"] + last["rounds"]) / max(last["rounds"], 1), 3)
        rows[name] = row
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--threshold", type=float, default=0.3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument(
        "--waves",
        type=int,
        default=1,
        help="requests per batch slot: batch x waves requests, at most batch running at once",
    )
    ap.add_argument("--arms", nargs="+", default=None, help="only these arms (none is kept)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    arms: dict[str, dict[str, Any] | None] = {
        "none": None,
        "mtp_k3": {"method": "mtp", "num_speculative_tokens": 3},
        "mtp_scheduled": {"method": "mtp", "num_speculative_tokens": 3,
                          "scheduling": "adaptive"},
        "dspark_k5": {"method": "dspark", "num_speculative_tokens": 5},
        "dspark_threshold": {"method": "dspark", "num_speculative_tokens": 5,
                             "confidence_threshold": args.threshold},
        "dspark_scheduled": {"method": "dspark", "num_speculative_tokens": 5,
                             "scheduling": "adaptive"},
    }  # fmt: skip
    if args.device.startswith("cuda"):  # the drafter's rounds from CUDA graphs, and not
        arms["dspark_k5_eager_draft"] = {"method": "dspark", "num_speculative_tokens": 5,
                                         "enforce_eager": True}  # fmt: skip
    if args.arms:
        arms = {name: spec for name, spec in arms.items() if name == "none" or name in args.arms}
    result: dict[str, Any] = {
        "benchmark": "speculative",
        "device": args.device,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "args": {k: v for k, v in vars(args).items() if k != "out"},
        "batches": {},
    }
    engines = {name: build_engine(args, spec) for name, spec in arms.items()}
    for batch in args.batches:
        for engine in engines.values():  # at most ``batch`` running; the other waves queue
            engine.scheduler.max_num_seqs = batch
        prompts = held_out_prompts(batch * args.waves, args.prompt_len)
        rows = run_batch(args, prompts, engines)
        base = rows["none"]["output_tok_per_s"]
        for row in rows.values():
            row["speedup"] = round(row["output_tok_per_s"] / base, 3)
        result["batches"][str(batch)] = rows
        print(batch, rows, flush=True)
    write_result(result, args.out, f"speculative_{args.device.split(':')[0]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
