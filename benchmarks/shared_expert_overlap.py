"""Config A's steps with the MoE's shared expert on a side stream and in line, side by side.

Builds config A as ``model_speed.py`` does (bf16, random weights, held as a checkpoint's) and
times, in one process, decode steps at each of ``--batches`` (CUDA graphs, slot rows, as the
engine runs them; ``step_ab.time_decode``) and a prefill of each of ``--prefill-lens``, with
``Backend.overlap_shared_experts`` off and on in turn, ``--repeats`` rounds (off, on, off,
on, ...), so both arms see the same machine state. A fresh set of graphs is captured for every
arm's decode run (the flag is read while a step is captured).

``--unfused`` first times the model as built, before :func:`deepinfer.models.weights_loaded`
fuses projections of one input (what ``model_speed.py`` timed before it finished the model as a
load does), overlap off: the launches that fusion saves, measured.

    python benchmarks/shared_expert_overlap.py [--batches 1 8 64 256] [--prefill-lens 1024]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

import torch
from _results import write_result
from model_speed import hold_as_checkpoint
from step_ab import device_name, free_memory, midsize_config, pick_api, time_decode, time_prefill

from deepinfer import plugins
from deepinfer.assets import init_random_weights
from deepinfer.models.deepseek_v4 import DeepseekV4ForCausalLM


def build(device: str, fused: bool) -> DeepseekV4ForCausalLM:
    """Config A on the sm100 kernels, held as a checkpoint's; ``fused``: its projections of
    one input fused, as a load finishes a model."""
    ops = plugins.backends.load("sm100")(device)
    model = DeepseekV4ForCausalLM(
        midsize_config(), dtype=torch.bfloat16, device=device, backend=ops
    )
    init_random_weights(model, seed=0)
    hold_as_checkpoint(model, fuse=fused)
    return model.eval()


def one_arm(model: DeepseekV4ForCausalLM, run: argparse.Namespace) -> dict[str, Any]:
    """Median decode ms at each batch and prefill tok/s at each length, as the flag stands."""
    api = pick_api(model, "new")
    top = model.cfg.vocab_size
    out: dict[str, Any] = {"decode_ms": {}, "prefill_tok_per_s": {}}
    with torch.inference_mode():
        for batch in run.batches:
            out["decode_ms"][batch] = time_decode(model, api, batch, run, top)["ms"]
            free_memory(run.device)
        g = torch.Generator().manual_seed(0)
        for n in run.prefill_lens:
            ids = torch.randint(3, top, (n,), generator=g).to(run.device)
            seconds = statistics.median(time_prefill(model, api, ids, run.prefill_reps, run.device))
            out["prefill_tok_per_s"][n] = round(n / seconds, 1)
            free_memory(run.device)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64, 256])
    ap.add_argument("--prefill-lens", type=int, nargs="*", default=[1024])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--decode-steps", type=int, default=20)
    ap.add_argument("--unfused", action="store_true")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    from deepinfer_kernels_sm100.backend import Sm100Backend

    run = argparse.Namespace(
        device="cuda", seed=0, decode_prompt_len=512, warmup_steps=5, prefill_group=16,
        decode_steps=args.decode_steps, prefill_reps=3, batches=args.batches,
        prefill_lens=args.prefill_lens, max_len=512 + 5 + args.decode_steps + 1,
    )  # fmt: skip
    arms: dict[str, list[dict[str, Any]]] = {"in_line": [], "overlap": []}
    if args.unfused:
        Sm100Backend.overlap_shared_experts = False
        arms["unfused_in_line"] = [one_arm(build(run.device, fused=False), run)]
        free_memory(run.device)
    model = build(run.device, fused=True)
    for _ in range(args.repeats):
        for arm, on in (("in_line", False), ("overlap", True)):
            Sm100Backend.overlap_shared_experts = on
            arms[arm].append(one_arm(model, run))
            print(arm, arms[arm][-1], file=sys.stderr)
    Sm100Backend.overlap_shared_experts = True
    result = {
        "benchmark": "shared_expert_overlap",
        "device_name": device_name(run.device),
        "torch": torch.__version__,
        "args": vars(args) | {"out": str(args.out) if args.out else None},
        "arms": arms,
    }
    write_result(result, args.out, "shared_expert_overlap")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
