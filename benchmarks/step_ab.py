#!/usr/bin/env python3
"""Speed of ONE code version of the model step, for an old-vs-new comparison of the step API.

The step API is being refactored (``forward_decode`` / ``forward_packed`` / ``forward(ids,
state)`` become one ``model(ForwardBatch)``), and the refactor must not cost speed. Comparing
two versions inside one process is impossible (one ``deepinfer`` per interpreter), so this
script measures whichever ``deepinfer`` is importable and prints one JSON object;
``step_ab_driver.py`` runs it once per version and round, alternating, in fresh processes.

``--what midsize``: config A of the model reference (2.1 B parameters, bf16, random weights)
on ``--device`` with the ``--backend`` op table:

* prefill of one ``--prefill-len`` (4096) token prompt as one chunk, the last token's logits
  only: prompt tokens per second, median of ``--prefill-reps`` after a warm-up;
* decode steps at B = ``--batches`` (1 32 256), each sequence having prefilled a
  ``--decode-prompt-len`` (512) token prompt, with states as rows of shared slot tensors (the
  engine's layout) and, where the backend allows, CUDA graphs: median ms a step
  (CUDA-synchronised) over ``--decode-steps`` after ``--warmup-steps``.

Both step APIs are supported behind two functions, :func:`StepApi.decode_step` and
:func:`StepApi.prefill`, picked once (``--api auto``: the new one where the model has no
``forward_decode`` any more). ``--small`` shrinks the model and shapes so the code path can be
checked on a CPU with the torch backend (its numbers mean nothing).

``--what tiny``: the embedded tiny model through ``deepinfer bench`` (nano-vllm protocol,
``--tiny-args`` passed on), which covers the engine around the step.

    python benchmarks/step_ab.py --what midsize --device cuda --backend sm100 [--out x.json]
    python benchmarks/step_ab.py --what tiny --device cpu --tiny-args "--num-seqs 4"
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import json
import platform
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

import deepinfer

if TYPE_CHECKING:
    from deepinfer.config import ModelConfig
    from deepinfer.models.deepseek_v4 import DeepseekV4ForCausalLM
    from deepinfer.models.graphs import DecodeGraphs
    from deepinfer.models.state import ModelState

#: Where ``pages_for`` lives, newest first.
PAGING_MODULES = ("deepinfer.models.paging", "deepinfer.paging", "deepinfer.cache.pages")

TESTS = Path(__file__).resolve().parents[1] / "packages/deepinfer-core/tests"

#: Shapes of a full run and of ``--small`` (a CPU check of the code path, not a measurement).
DEFAULTS: dict[str, dict[str, Any]] = {
    "full": {
        "prefill_len": 4096,
        "prefill_reps": 5,
        "decode_prompt_len": 512,
        "batches": [1, 32, 256],
        "max_len": 1024,
        "warmup_steps": 5,
        "decode_steps": 20,
        "prefill_group": 16,
    },
    "small": {
        "prefill_len": 256,
        "prefill_reps": 2,
        "decode_prompt_len": 160,
        "batches": [1, 4],
        "max_len": 256,
        "warmup_steps": 2,
        "decode_steps": 5,
        "prefill_group": 2,
    },
}


# -- the two step APIs ----------------------------------------------------------------------------


@dataclass(frozen=True)
class StepApi:
    """The two calls the benchmark makes, in whichever API this ``deepinfer`` has.

    Chosen once, so the timed loops are the same code for both versions and differ only in
    the one call that the refactor changed.
    """

    name: str
    #: One token per single-sequence state: ``ids`` [B] on the device -> logits [B, V].
    decode_step: Callable[
        [DeepseekV4ForCausalLM, Tensor, Sequence[ModelState], DecodeGraphs | None], Tensor
    ]
    #: One chunk [S_i] per state, in one step -> the last token's logits per chunk.
    prefill: Callable[[DeepseekV4ForCausalLM, Sequence[Tensor], Sequence[ModelState]], Tensor]


def old_api() -> StepApi:
    """``forward_decode`` and ``forward_packed`` (up to d8d25d7). Prefill goes through
    ``forward_packed`` even for one chunk: it keeps only the last token's logits, as the new
    API's ``num_logits=1`` does, where ``model(ids, state)`` would compute all 4096 x V."""

    def decode_step(
        model: DeepseekV4ForCausalLM,
        ids: Tensor,
        states: Sequence[ModelState],
        graphs: DecodeGraphs | None,
    ) -> Tensor:
        return model.forward_decode(ids, states, graphs)  # type: ignore[attr-defined]

    def prefill(
        model: DeepseekV4ForCausalLM, chunks: Sequence[Tensor], states: Sequence[ModelState]
    ) -> Tensor:
        return model.forward_packed(chunks, states)  # type: ignore[attr-defined]

    return StepApi("old", decode_step, prefill)


def new_api() -> StepApi:
    """``model(ForwardBatch)``. The batch is built inside the timed call: describing the step
    is part of what the new API costs a step.

    A decode step is described by ``ForwardBatch.decode(ids, states)`` where the class has it
    (the ids stay one [B] tensor, as the engine holds them), else by ``build`` of B one-token
    chunks; a lone prefill chunk by ``ForwardBatch.of(..., num_logits=1)``, several by ``build``
    (the last token's logits each).
    """
    from deepinfer.models.batch import ForwardBatch  # type: ignore[import-not-found]

    whole = hasattr(ForwardBatch, "decode")

    def decode_step(
        model: DeepseekV4ForCausalLM,
        ids: Tensor,
        states: Sequence[ModelState],
        graphs: DecodeGraphs | None,
    ) -> Tensor:
        if whole:
            batch = ForwardBatch.decode(ids, states)
        else:
            batch = ForwardBatch.build([ids[i : i + 1] for i in range(len(states))], states)
        return model(batch, graphs=graphs).logits

    def prefill(
        model: DeepseekV4ForCausalLM, chunks: Sequence[Tensor], states: Sequence[ModelState]
    ) -> Tensor:
        if len(chunks) == 1:
            batch = ForwardBatch.of(chunks[0].reshape(1, -1), states[0], num_logits=1)
        else:
            batch = ForwardBatch.build(chunks, states)
        return model(batch).logits

    return StepApi("new" if whole else "new (decode via build)", decode_step, prefill)


def pick_api(model: DeepseekV4ForCausalLM, choice: str) -> StepApi:
    """``auto``: the old API while the model still has ``forward_decode`` (a tree in the middle
    of the refactor may already have ``deepinfer.models.batch`` but not use it yet), else the
    new one, which must then be importable."""
    if choice == "auto":
        choice = "old" if hasattr(model, "forward_decode") else "new"
    return old_api() if choice == "old" else new_api()


# -- helpers --------------------------------------------------------------------------------------


def sync(device: str) -> None:
    """Wait for the device, so a wall-clock interval covers the work it queued."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def device_name(device: str) -> str:
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    return platform.processor() or platform.machine() or device


def pages_for(num_tokens: int) -> int:
    """Entry pages of ``num_tokens`` tokens, from wherever this version keeps the page
    arithmetic (it moves out of ``deepinfer.cache`` in the refactor)."""
    for name in PAGING_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError:
            continue
        return int(module.pages_for(num_tokens))
    raise ModuleNotFoundError(f"no pages_for in any of {PAGING_MODULES}")


def free_memory(device: str) -> None:
    """Give the previous measurement's tensors and graph pools back before the next one, so
    every batch size starts from the same memory and the peaks do not add up."""
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


def small_config() -> ModelConfig:
    """Config A's structure (hash layers, ratio-4 and ratio-128 compression, MTP) at a size a
    shared 2-core CPU runs in seconds."""
    from deepinfer.config import ModelConfig

    return ModelConfig(
        vocab_size=4096,
        hidden_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        head_dim=64,
        qk_rope_head_dim=32,
        q_lora_rank=128,
        o_groups=2,
        o_lora_rank=64,
        n_routed_experts=4,
        n_shared_experts=1,
        num_experts_per_tok=2,
        moe_intermediate_size=128,
        num_hash_layers=1,
        index_n_heads=4,
        index_head_dim=32,
        index_topk=16,
        sliding_window=32,
        hc_mult=4,
        compress_ratios=[4, 128, 0],
        num_nextn_predict_layers=1,
    )


def midsize_config() -> ModelConfig:
    """Config A from the mid-size test, the same file for both versions (this script's tree),
    so the two runs of a pair build the same model."""
    sys.path.insert(0, str(TESTS))
    from test_midsize import config_a  # type: ignore[import-not-found]

    return config_a()


# -- midsize --------------------------------------------------------------------------------------


def time_prefill(  # noqa: PLR0917
    model: DeepseekV4ForCausalLM,
    api: StepApi,
    ids: Tensor,
    reps: int,
    device: str,
    slots: Any = None,
) -> list[float]:
    """Seconds of one prefill of ``ids`` [S] from a fresh state, ``reps`` times after a warm-up
    (the first call pays for kernel compilation and allocator growth). With ``slots``
    (:func:`prefill_slots`) the state is a slot of them, as the engine's are (entries in
    pages); else the model's own ``new_state``."""
    times = []
    for rep in range(reps + 1):
        state = model.new_state(1) if slots is None else slots.new_state()
        sync(device)
        start = time.perf_counter()
        api.prefill(model, [ids], [state])
        sync(device)
        if rep:
            times.append(time.perf_counter() - start)
        if slots is not None:
            slots.release(state)
        del state
    return times


def prefill_fresh(
    model: DeepseekV4ForCausalLM, api: StepApi, ids: Tensor, slots: Any = None
) -> None:
    """One prefill of ``ids`` [S] from a fresh state: a slot of ``slots`` (given back after),
    or with None the model's own ``new_state``."""
    state = model.new_state(1) if slots is None else slots.new_state()
    api.prefill(model, [ids], [state])
    if slots is not None:
        slots.release(state)


def prefill_slots(model: DeepseekV4ForCausalLM, tokens: int, slots: int = 1) -> Any:
    """``slots`` slots for prompts of ``tokens``, their entry pages allocated up front: the
    states an engine prefills prompts into."""
    from deepinfer.cache.slots import StateSlots

    return StateSlots(
        lambda: model.new_state(1),
        max_slots=slots,
        max_len=tokens + 1,
        initial_slots=slots,
        initial_pages=slots * pages_for(tokens + 1),
    )


def time_decode(
    model: DeepseekV4ForCausalLM, api: StepApi, batch: int, args: argparse.Namespace, top: int
) -> dict[str, Any]:
    """Median ms of a decode step of ``batch`` sequences in slot rows, as the engine runs them.

    Every sequence first prefills ``decode_prompt_len`` random tokens, ``prefill_group``
    sequences a pass (256 x 512 tokens at once would need far more activation memory than the
    engine's token budget allows). All entry pages are allocated up front, so no step grows
    the shared tensors (which would move them and force a graph capture inside the timing).
    The ids are drawn before each step's timer starts; each step advances the states.
    """
    from deepinfer.cache.slots import StateSlots
    from deepinfer.models.graphs import DecodeGraphs

    device = args.device
    needed = args.decode_prompt_len + args.warmup_steps + args.decode_steps
    if needed > args.max_len:
        raise SystemExit(f"--max-len {args.max_len} is below the {needed} tokens a row reaches")
    g = torch.Generator().manual_seed(args.seed + batch)
    slots = StateSlots(
        lambda: model.new_state(1),
        max_slots=batch,
        max_len=args.max_len,
        initial_slots=batch,
        initial_pages=batch * pages_for(args.max_len),
    )
    states = [slots.new_state() for _ in range(batch)]
    for first in range(0, batch, args.prefill_group):
        group = states[first : first + args.prefill_group]
        chunks = [
            torch.randint(3, top, (args.decode_prompt_len,), generator=g).to(device) for _ in group
        ]
        api.prefill(model, chunks, group)
    use_graphs = device.startswith("cuda") and model.ops.supports_cuda_graphs(model.dtype)
    graphs = DecodeGraphs(batch) if use_graphs else None
    times = []
    for step in range(args.warmup_steps + args.decode_steps):
        ids = torch.randint(3, top, (batch,), generator=g).to(device)
        sync(device)
        start = time.perf_counter()
        logits = api.decode_step(model, ids, states, graphs)
        sync(device)
        if step >= args.warmup_steps:
            times.append(time.perf_counter() - start)
    if tuple(logits.shape) != (batch, model.cfg.vocab_size):
        raise RuntimeError(f"decode logits {tuple(logits.shape)}, expected [{batch}, V]")
    out = {
        "ms": round(statistics.median(times) * 1e3, 3),
        "ms_all": [round(t * 1e3, 3) for t in times],
        "cuda_graphs": graphs.num_captured if graphs is not None else 0,
    }
    del states, slots, graphs, logits
    return out


def midsize(args: argparse.Namespace) -> dict[str, Any]:
    """Prefill and decode of config A, with random weights: a model as large as a real one's
    layers make the step's device work realistic, so a host-side cost of the new API shows in
    proportion (the tiny model would exaggerate it), and no checkpoint is needed."""
    from deepinfer import plugins
    from deepinfer.assets import init_random_weights
    from deepinfer.models.deepseek_v4 import DeepseekV4ForCausalLM

    device = args.device
    cfg = small_config() if args.small else midsize_config()
    ops = plugins.backends.load(args.backend)(device)
    model = DeepseekV4ForCausalLM(cfg, dtype=torch.bfloat16, device=device, backend=ops)
    init_random_weights(model, seed=0)  # drawn on the CPU: the same weights on every device
    model.eval()
    api = pick_api(model, args.api)
    top = min(cfg.vocab_size, cfg.image_token_id or cfg.vocab_size)
    metrics: dict[str, float] = {}
    details: dict[str, Any] = {
        "api": api.name,
        "params": sum(p.numel() for p in model.parameters()),
    }
    with torch.inference_mode():  # as the engine runs its steps
        g = torch.Generator().manual_seed(args.seed)
        ids = torch.randint(3, top, (args.prefill_len,), generator=g).to(device)
        times = time_prefill(model, api, ids, args.prefill_reps, device)
        median = statistics.median(times)
        metrics[f"prefill_{args.prefill_len}_tok_per_s"] = round(args.prefill_len / median, 1)
        details["prefill_s_all"] = [round(t, 4) for t in times]
        free_memory(device)
        for batch in args.batches:
            if device.startswith("cuda"):
                torch.cuda.reset_peak_memory_stats(device)
            step = time_decode(model, api, batch, args, top)
            metrics[f"decode_B{batch}_ms"] = step.pop("ms")
            if device.startswith("cuda"):
                step["peak_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
            details[f"decode_B{batch}"] = step
            print(f"B={batch}: {metrics[f'decode_B{batch}_ms']} ms a step", file=sys.stderr)
            free_memory(device)
    return {"metrics": metrics, "details": details}


# -- tiny -----------------------------------------------------------------------------------------


def tiny(args: argparse.Namespace) -> dict[str, Any]:
    """``deepinfer bench`` on the tiny model, through the CLI's own parser (so each version
    runs with its own defaults) and its Python entry point; its table goes to stderr, so
    stdout stays one JSON object, and its numbers are read back from its ``--json`` file."""
    from deepinfer.cli import build_parser

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.json"
        argv = ["bench", "--model", "tiny", "--device", args.device, *shlex.split(args.tiny_args)]
        ns = build_parser().parse_args([*argv, "--json", str(path)])
        with contextlib.redirect_stdout(sys.stderr):
            rc = ns.func(ns)
        if rc:
            raise SystemExit(f"deepinfer bench exited with {rc}")
        bench = json.loads(path.read_text())
    keys = ("output_tok_per_s", "total_tok_per_s", "seconds")
    return {
        "metrics": {k: bench[k] for k in keys},
        "details": {"bench_argv": argv, "bench": bench},
    }


# -- main -----------------------------------------------------------------------------------------


def at_least(low: int) -> Callable[[str], int]:
    """An argparse type for an int >= ``low``: a zero count would only fail after the model
    has been built, minutes into a GPU run."""

    def parse(text: str) -> int:
        value = int(text)
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} is below {low}")
        return value

    return parse


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--what", choices=("midsize", "tiny"), required=True)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--backend", default="torch", help="midsize op table: torch, or sm100")
    ap.add_argument("--api", choices=("auto", "old", "new"), default="auto")
    ap.add_argument("--small", action="store_true", help="midsize: tiny shapes, a CPU check")
    ap.add_argument("--seed", type=int, default=0)
    for name, low in (
        ("prefill-len", 1),
        ("prefill-reps", 1),
        ("decode-prompt-len", 1),
        ("max-len", 2),
        ("warmup-steps", 0),
        ("decode-steps", 1),
        ("prefill-group", 1),
    ):
        ap.add_argument(f"--{name}", type=at_least(low), default=None, help="default: DEFAULTS")
    ap.add_argument("--batches", type=at_least(1), nargs="+", default=None)
    ap.add_argument(
        "--tiny-args",
        default="",
        help='tiny: more `deepinfer bench` options, e.g. --tiny-args="--num-seqs 64"',
    )
    ap.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = ap.parse_args(argv)
    for key, value in DEFAULTS["small" if args.small else "full"].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def recorded_args(args: argparse.Namespace) -> dict[str, Any]:
    """The options that shaped this run (a tiny run ignores the midsize shapes, and the other
    way round), so a result file says what was measured."""
    shapes = set(DEFAULTS["full"]) | {"backend", "api", "small", "seed"}
    skip = {"out", "tiny_args"} if args.what == "midsize" else {"out", *shapes}
    return {k: v for k, v in vars(args).items() if k not in skip}


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    run = midsize if args.what == "midsize" else tiny
    body = run(args)
    result = {
        "what": args.what,
        "small": args.small,
        "deepinfer": str(Path(deepinfer.__file__).resolve()),
        "torch": torch.__version__,
        "device": args.device,
        "device_name": device_name(args.device),
        "backend": args.backend if args.what == "midsize" else "engine default",
        "args": recorded_args(args),
        **body,
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
