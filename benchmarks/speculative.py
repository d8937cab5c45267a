"""Speculative decoding on the embedded tiny model: output tok/s and acceptance, side by side.

Arms, each timed in this process on the same prompts (windows of the held-out plays, so the
drafter has not seen them): no speculation; DSpark with every draft verified (k = 5); DSpark
with the static confidence threshold (``--threshold``); DSpark with confidence-scheduled,
load-aware verification (``scheduling: "adaptive"``: each step verifies the drafts worth their
cost on the cost table the engine profiles at start, outside the timed run). The tiny model is
V4.1, whose MTP drafting is not implemented, so MTP is not an arm here. For each batch size the
engine generates ``--output-len`` greedy tokens per sequence (all submitted at once); output tok/s
is ``batch * output_len / wall seconds`` (median of ``--repeats`` runs of one engine, after an
untimed first run that captures its graphs; prefix caching off), and tau is the mean acceptance
length over the last run: drafts kept per verification round, plus one.

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


def run_arm(
    args: argparse.Namespace, prompts: list[list[int]], spec: dict[str, Any] | None
) -> dict[str, Any]:
    from deepinfer import plugins
    from deepinfer.assets import tiny_model, tiny_tokenizer
    from deepinfer.device import select_backend
    from deepinfer.engine.config import EngineConfig
    from deepinfer.engine.engine import LLMEngine
    from deepinfer.sampling_params import SamplingParams

    choice = select_backend(args.device)  # as LLM picks it: sm100 on an NVIDIA GPU
    backend = plugins.backends.load(choice.backend)(choice.device)
    model = tiny_model(torch.float32, choice.device, backend)
    params = SamplingParams(temperature=0.0, max_tokens=args.output_len, ignore_eos=True)
    # One engine an arm, a first run untimed (graphs captured on first use, kernels compiled),
    # then the timed runs; no prefix cache, so every run computes its prompts.
    config = EngineConfig(
        speculative_config=spec, async_scheduling=False, enable_prefix_caching=False
    )
    engine = LLMEngine(model, tiny_tokenizer(), config)
    times, rounds, kept, drafts, accepted = [], 0, 0, 0, 0
    for run in range(args.repeats + 1):
        for p in prompts:
            engine.add_request(p, params)
        before = (engine.spec.num_drafts, engine.spec.num_accepted) if engine.spec else (0, 0)
        start = time.perf_counter()
        done = engine.run()
        if run:
            times.append(time.perf_counter() - start)
        metrics = [o.metrics for o in done.values() if o.metrics is not None]
        rounds = sum(m.spec_rounds for m in metrics)
        kept = sum(m.spec_accepted_tokens for m in metrics)
        if engine.spec is not None:  # the last run's
            drafts = engine.spec.num_drafts - before[0]
            accepted = engine.spec.num_accepted - before[1]
    seconds = statistics.median(times)
    row: dict[str, Any] = {
        "output_tok_per_s": round(len(prompts) * args.output_len / seconds, 1),
        "seconds": round(seconds, 3),
    }
    if engine.spec is not None:  # the last run's
        row["drafts_verified"] = drafts
        if engine.spec.verifier is not None:  # drafts proposed (all runs), before the cut
            row["drafts_offered"] = engine.spec.verifier.offered
        row["drafts_kept"] = accepted
        row["tau"] = round((kept + rounds) / max(rounds, 1), 3)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--threshold", type=float, default=0.3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    arms: dict[str, dict[str, Any] | None] = {
        "none": None,
        "dspark_k5": {"method": "dspark", "num_speculative_tokens": 5},
        "dspark_threshold": {"method": "dspark", "num_speculative_tokens": 5,
                             "confidence_threshold": args.threshold},
        "dspark_scheduled": {"method": "dspark", "num_speculative_tokens": 5,
                             "scheduling": "adaptive"},
    }  # fmt: skip
    result: dict[str, Any] = {
        "benchmark": "speculative",
        "device": args.device,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "args": {k: v for k, v in vars(args).items() if k != "out"},
        "batches": {},
    }
    for batch in args.batches:
        prompts = held_out_prompts(batch, args.prompt_len)
        rows = {name: run_arm(args, prompts, spec) for name, spec in arms.items()}
        base = rows["none"]["output_tok_per_s"]
        for row in rows.values():
            row["speedup"] = round(row["output_tok_per_s"] / base, 3)
        result["batches"][str(batch)] = rows
        print(batch, rows, flush=True)
    write_result(result, args.out, f"speculative_{args.device.split(':')[0]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
