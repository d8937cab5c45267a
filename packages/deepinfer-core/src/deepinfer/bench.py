"""``deepinfer bench``: offline throughput with nano-vllm's protocol.

N sequences with random prompt lengths (random token ids) and random output lengths, generated
with ``ignore_eos`` so every sequence produces exactly its output length; all are submitted at
once and the wall time from submission to the last token is measured.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path
from typing import Any

from deepinfer.cli import UsageError, check_interrupted, deferred_interrupts, model_options
from deepinfer.sampling_params import SamplingParams


def check_options(args: argparse.Namespace) -> None:
    """Reject inconsistent options before the model loads and the benchmark runs.

    argparse has already checked each number on its own; what remains are the ranges and the
    ``--json`` path, which would otherwise fail only after the whole benchmark had run.
    """
    for kind in ("input", "output"):
        low, high = getattr(args, f"min_{kind}_len"), getattr(args, f"max_{kind}_len")
        if low > high:
            raise UsageError(f"--min-{kind}-len", f"{low} is greater than --max-{kind}-len {high}")
    if args.speculative_method is None:
        for flag, value, default in (
            ("--speculative-scheduling", args.speculative_scheduling, "fixed"),
            ("--confidence-threshold", args.confidence_threshold, 0.0),
        ):
            if value != default:
                raise UsageError(flag, "needs --speculative-method")
    if args.json:
        check_writable(Path(args.json))


def check_writable(path: Path) -> None:
    """Create ``path``'s folder and make sure the file can be written, leaving no file behind."""
    existed = path.exists()
    ancestor = path.parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise UsageError("--json", f"cannot write {path}: {ancestor} is not a folder")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a"):
            pass
        if not existed:
            path.unlink()
    except OSError as exc:
        raise UsageError("--json", f"cannot write {path}: {exc.strerror or exc}") from exc


def run_bench(args: argparse.Namespace) -> int:
    check_options(args)
    with deferred_interrupts():  # torch: only once the options are known to be good
        from deepinfer.llm import LLM

    llm = LLM(
        args.model,
        **model_options(args),
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        enable_prefix_caching=False,
        enforce_eager=args.enforce_eager,
        async_scheduling=args.async_scheduling,
        speculative_config=speculative_config(args),
    )
    rnd = random.Random(args.seed)
    cfg = llm.engine.model.cfg
    # Random text ids: below the image placeholder, which needs embeddings a text run lacks.
    top = cfg.vocab_size if cfg.image_token_id is None else min(cfg.vocab_size, cfg.image_token_id)
    prompts = [
        [rnd.randrange(3, top) for _ in range(rnd.randint(args.min_input_len, args.max_input_len))]
        for _ in range(args.num_seqs)
    ]
    params = [
        SamplingParams(
            temperature=0.6,
            ignore_eos=True,
            max_tokens=rnd.randint(args.min_output_len, args.max_output_len),
        )
        for _ in range(args.num_seqs)
    ]
    llm.generate([[1, 2, 3]], SamplingParams(max_tokens=2), use_tqdm=False)  # warm-up
    check_interrupted()
    spent = spec_seconds(llm.engine.spec)
    start = time.perf_counter()
    outs = llm.generate(prompts, params)
    elapsed = time.perf_counter() - start
    check_interrupted()
    out_tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    graphs = llm.engine.runner.graphs
    in_tokens = sum(len(p) for p in prompts)
    result = {
        "model": args.model,
        "load_format": args.load_format,
        "quantization": args.quantization,
        "device": llm.device,
        "num_seqs": args.num_seqs,
        "input_tokens": in_tokens,
        "output_tokens": out_tokens,
        "seconds": round(elapsed, 3),
        "output_tok_per_s": round(out_tokens / elapsed, 2),
        "total_tok_per_s": round((in_tokens + out_tokens) / elapsed, 2),
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "engine_steps": llm.engine.num_steps,
        "async_scheduling": llm.engine.async_scheduling,
        # Whole decode steps, captured at startup (per batch bucket and entry bucket) or, for
        # longer contexts, on first use.
        "cuda_graphs": graphs.num_captured if graphs is not None else 0,
    }
    if llm.engine.spec is not None:
        result.update(acceptance(outs, llm.engine.spec, spent))
    width = max(len(k) for k in result)
    print("\n".join(f"{k:<{width}}  {v}" for k, v in result.items()))
    if args.json:
        try:
            Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
        except OSError as exc:
            raise UsageError("--json", f"cannot write {args.json}: {exc.strerror or exc}") from exc
    return 0


def speculative_config(args: argparse.Namespace) -> dict[str, object] | None:
    """vLLM's ``speculative_config`` from ``--speculative-method`` (None: no speculation)."""
    if args.speculative_method is None:
        return None
    config: dict[str, object] = {
        "method": args.speculative_method,
        "num_speculative_tokens": args.num_speculative_tokens,
    }
    if args.speculative_scheduling != "fixed":
        config["scheduling"] = args.speculative_scheduling
    if args.confidence_threshold:
        config["confidence_threshold"] = args.confidence_threshold
    return config


def spec_seconds(runner: Any) -> tuple[float, float]:
    """The speculative runner's drafting and verification seconds so far (none without)."""
    return (runner.draft_seconds, runner.verify_seconds) if runner is not None else (0.0, 0.0)


def acceptance(outs: list[Any], runner: Any, before: tuple[float, float]) -> dict[str, object]:
    """Speculative decoding over the run: tau (tokens a verification row emitted, on
    average), the drafts a row verified (fewer than drafted under a confidence schedule), the
    share of rows that kept a draft at each position, and the seconds the run spent drafting
    and in verification steps (``runner``'s totals since ``before``: each pass once)."""
    draft, verify = (now - then for now, then in zip(spec_seconds(runner), before, strict=True))
    times = {"spec_draft_seconds": round(draft, 4), "spec_verify_seconds": round(verify, 4)}
    metrics = [o.metrics for o in outs if o.metrics is not None and o.metrics.spec_rounds]
    if not metrics:  # no round verified a draft (a schedule may find none worth it)
        return {"spec_rounds": 0, **times}
    rounds = sum(m.spec_rounds for m in metrics)
    kept = sum(m.spec_accepted_tokens for m in metrics)
    width = max(len(m.spec_accepted_per_position) for m in metrics)
    per = [0] * width
    for m in metrics:
        for j, count in enumerate(m.spec_accepted_per_position):
            per[j] += count
    return {
        "spec_rounds": rounds,
        "spec_acceptance_length": round((kept + rounds) / rounds, 3),
        "spec_verified_per_round": round(sum(m.spec_draft_tokens for m in metrics) / rounds, 3),
        "spec_acceptance_per_position": [round(c / rounds, 3) for c in per],
        **times,
    }
