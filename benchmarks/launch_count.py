"""Kernels a decode step launches, counted on the CPU: the B = 1 step's time on a GPU follows it.

A captured decode step of config A at batch 1 is a chain of about 1,400 small kernels, and the
GPU is idle between them for about 40% of the step (``model_speed.py``'s profile): each kernel
removed saves its launch gap whatever it computes. This counts them without a GPU, so a change
can be checked for what it removes before it is timed:

* the ``sm100`` backend's Triton kernels, run in Triton's interpreter (``TRITON_INTERPRET=1``,
  set here), each launch counted by kernel name;
* every torch op that launches a kernel of its own on a GPU (everything but views, shape
  queries and allocations), counted by op name, outside the Triton launches.

Only the model's layers are counted (``run_layers``: what a captured step replays), over slot
rows that continue a prefilled prompt, at the first decode step after it. The layers keep config
A's (or V4-Flash's) schedule of layer kinds at a width the interpreter runs in seconds; widths do
not change which ops run. cuBLAS may split a matmul into two kernels on a GPU, and a few
kernels take another path under the interpreter (noted in the output): the counts are the
model's launches, not a GPU trace.

``--prefill N`` also counts one prefill chunk of N tokens from a fresh state (whose kernels the
host issues one by one: ``host_time.py`` shows a 4k chunk bound by that). ``--verify K`` counts a
speculative round's verification pass at each batch: rows of the last token and K drafts, whose
captured pass a round replays where a plain step replays the decode step's.

``--models tiny`` counts the embedded tiny model (its trained weights, V4.1), the model the
speculative benchmarks run.

    python benchmarks/launch_count.py [--models config_a v4_flash tiny] [--batches 1 8]
        [--prefill 64] [--verify 5]
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

import argparse
import collections
import dataclasses
import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from _results import RESULTS, write_result
from low_precision import FLASH_CONFIG, cut
from step_ab import midsize_config, prefill_slots
from torch.utils._python_dispatch import TorchDispatchMode

from deepinfer.assets import init_random_weights, tiny_config, tiny_model
from deepinfer.cache.slots import StateSlots
from deepinfer.config import ModelConfig
from deepinfer.models import weights_loaded
from deepinfer.models.batch import ForwardBatch
from deepinfer.models.decode import run_decode
from deepinfer.models.deepseek_v4 import DeepseekV4ForCausalLM
from deepinfer.models.state import ModelState
from deepinfer.models.verify import run_verify
from deepinfer.paging import pages_for

#: Widths the interpreter runs in seconds (the layer schedule and routing stay the model's).
NARROW: dict[str, Any] = {
    "vocab_size": 4096,
    "hidden_size": 256,
    "num_attention_heads": 8,
    "head_dim": 128,
    "qk_rope_head_dim": 64,
    "q_lora_rank": 128,
    "o_lora_rank": 128,
    "moe_intermediate_size": 128,
    "index_n_heads": 4,
    "index_head_dim": 64,
    "index_topk": 16,
    "sliding_window": 32,
}

#: Torch ops that launch no kernel: views, metadata and allocations.
NO_KERNEL = frozenset(
    {
        "view", "_unsafe_view", "reshape", "expand", "slice", "select", "as_strided",
        "unsqueeze", "squeeze", "permute", "t", "transpose", "detach", "alias", "split",
        "split_with_sizes", "unbind", "unflatten", "flatten", "view_as", "empty",
        "empty_like", "empty_strided", "new_empty", "new_empty_strided", "lift_fresh",
        "_reshape_alias", "sym_size", "sym_stride", "sym_numel", "is_same_size", "dim",
        "_has_compatible_shallow_copy_type", "chunk", "narrow", "diagonal", "movedim",
        "set_", "resize_", "_local_scalar_dense",
    }
)  # fmt: skip


def config_a() -> ModelConfig:
    """Config A (the mid-size test's: two plain layers, seven ratio-4 and seven ratio-128 ones,
    an MTP layer; three hash-routed layers, 16 experts top-4) at :data:`NARROW` widths."""
    return dataclasses.replace(midsize_config(), **NARROW)


def v4_flash() -> ModelConfig:
    """The published V4-Flash config cut to four layers, at :data:`NARROW` widths (its layers
    in bf16: the stored formats' kernels are counted by ``low_precision.py``)."""
    raw = cut(json.loads(FLASH_CONFIG.read_text()), 4) | NARROW
    raw.pop("quantization_config", None)
    return ModelConfig.from_dict(raw)


#: ``tiny``: the embedded model (V4.1), built with its trained weights (:func:`build`).
MODELS = {"config_a": config_a, "v4_flash": v4_flash, "tiny": tiny_config}


class _Counter(TorchDispatchMode):
    """Counts the torch ops that launch a kernel, by name (paused inside Triton launches)."""

    def __init__(self, where: bool = False) -> None:
        super().__init__()
        self.ops: collections.Counter[str] = collections.Counter()
        #: With ``where``: the same ops by the model code that called them.
        self.sites: collections.Counter[str] = collections.Counter()
        self.where = where
        self.paused = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if not self.paused and name not in NO_KERNEL:
            self.ops[name] += 1
            if self.where:
                self.sites[f"{name} @ {caller()}"] += 1
        return func(*args, **(kwargs or {}))


def caller() -> str:
    """The innermost frame of DeepInfer's own code on the stack (file:line function)."""
    frame = sys._getframe(2)
    while frame is not None:
        code = frame.f_code
        if "/deepinfer" in code.co_filename and "launch_count" not in code.co_filename:
            return f"{Path(code.co_filename).name}:{frame.f_lineno} {code.co_name}"
        frame = frame.f_back
    return "?"


@contextmanager
def counting(counter: _Counter) -> Iterator[collections.Counter[str]]:
    """Count Triton launches by kernel name (their inner torch ops not counted) and torch ops
    by ``counter``, while inside."""
    from triton.runtime.interpreter import InterpretedFunction

    launches: collections.Counter[str] = collections.Counter()
    original = InterpretedFunction.run

    def run(self, *args, **kwargs):
        launches[self.fn.__name__] += 1
        counter.paused += 1
        try:
            return original(self, *args, **kwargs)
        finally:
            counter.paused -= 1

    InterpretedFunction.run = run  # type: ignore[method-assign]
    try:
        with counter:
            yield launches
    finally:
        InterpretedFunction.run = original  # type: ignore[method-assign]


def skip_kernels() -> None:
    """Launch the Triton kernels without running them (``--skip-kernels``): their outputs stay
    unwritten, which changes no launch, since the passes counted here make no host decision on
    a kernel's values; a 4k-token prefill is then counted in seconds, not a quarter of an hour.
    """
    from triton.runtime.interpreter import InterpretedFunction

    InterpretedFunction.run = lambda self, *args, **kwargs: None  # type: ignore[method-assign]


def kernel_ops() -> Any:
    """The ``sm100`` backend bound to the CPU, its kernels interpreted (no GPU check)."""
    from deepinfer_kernels_sm100.backend import Sm100Backend

    ops = object.__new__(Sm100Backend)
    ops.device = torch.device("cpu")
    return ops


def build(cfg: ModelConfig, dtype: torch.dtype) -> DeepseekV4ForCausalLM:
    """The model in ``dtype`` (bf16 as on a GPU: its casts count; the interpreter's bf16 values
    are not the GPU's, which does not change what launches) on the interpreted kernels."""
    if cfg == tiny_config():
        return tiny_model(dtype, "cpu", kernel_ops()).eval()  # type: ignore[return-value]
    model = DeepseekV4ForCausalLM(cfg, dtype=dtype, device="cpu")
    init_random_weights(model, seed=0)
    model.ops = kernel_ops()
    weights_loaded(model)  # as a load does: projections of one input fused, on this backend
    model.eval()
    return model


def counted_layers(
    model: DeepseekV4ForCausalLM, call: Callable[[], object], where: bool, label: dict[str, Any]
) -> dict[str, Any]:
    """What ``call`` launches inside the model's layers (``run_layers``), as a result row."""
    counter = _Counter(where)
    run_layers = model.run_layers
    found: dict[str, collections.Counter[str]] = {}

    def counted(*args: Any, **kwargs: Any) -> Any:
        with counting(counter) as launches:
            out = run_layers(*args, **kwargs)
        found["triton"] = launches
        return out

    model.run_layers = counted  # type: ignore[method-assign]
    try:
        call()
    finally:
        model.run_layers = run_layers  # type: ignore[method-assign]
    triton, aten = found["triton"], counter.ops
    return {
        **label,
        "kernels": sum(triton.values()) + sum(aten.values()),
        "triton_launches": sum(triton.values()),
        "torch_ops": sum(aten.values()),
        "triton": dict(triton.most_common()),
        "torch": dict(aten.most_common()),
        **({"torch_by_caller": dict(counter.sites.most_common())} if where else {}),
    }


def prefilled_rows(
    model: DeepseekV4ForCausalLM, batch: int, prompt_len: int, slack: int = 0
) -> tuple[list[ModelState], torch.Generator]:
    """``batch`` slot states (``slack`` for rollback) each prefilled with a random
    ``prompt_len``-token prompt, and the generator that drew them, for the next ids."""
    max_len = prompt_len + slack + 4
    slots = StateSlots(
        lambda: model.new_state(1, slack=slack),
        max_slots=batch,
        max_len=max_len,
        initial_slots=batch,
        initial_pages=batch * pages_for(max_len),
    )
    states = [slots.new_state() for _ in range(batch)]
    g = torch.Generator().manual_seed(0)
    vocab = model.cfg.vocab_size
    prompts = [torch.randint(3, vocab, (prompt_len,), generator=g) for _ in states]
    model(ForwardBatch.build(prompts, states))
    return states, g


def count_step(
    cfg: ModelConfig, batch: int, prompt_len: int, where: bool, dtype: torch.dtype
) -> dict[str, Any]:
    """Launches of one decode step of ``batch`` slot rows after a ``prompt_len`` prefill."""
    model = build(cfg, dtype)
    states, g = prefilled_rows(model, batch, prompt_len)
    ids = torch.randint(3, cfg.vocab_size, (batch,), generator=g)
    return counted_layers(
        model, lambda: run_decode(model, ids, states, None), where, {"batch": batch}
    )


def count_verify(  # noqa: PLR0917 - as count_step, plus the drafts
    cfg: ModelConfig, batch: int, drafts: int, prompt_len: int, where: bool, dtype: torch.dtype
) -> dict[str, Any]:
    """Launches of one verification pass (:func:`~deepinfer.models.verify.run_verify`) of
    ``batch`` rows of a last token and ``drafts`` drafts each, over states with the rollback
    slack speculation gives them, after a ``prompt_len`` prefill: what a speculative round
    captures where a plain step captures :func:`count_step`'s."""
    model = build(cfg, dtype)
    states, g = prefilled_rows(model, batch, prompt_len, slack=drafts)
    rows = [torch.randint(3, cfg.vocab_size, (drafts + 1,), generator=g) for _ in states]
    return counted_layers(
        model,
        lambda: run_verify(model, rows, states, None),
        where,
        {"batch": batch, "verify_tokens": drafts + 1},
    )


def count_prefill(
    cfg: ModelConfig, tokens: int, where: bool, dtype: torch.dtype, state: str = "slot"
) -> dict[str, Any]:
    """Launches of one prefill chunk of ``tokens`` from a fresh state: the chunk's kernels are
    issued by the host one by one (no CUDA graph), so on a GPU their count sets its host time
    (``host_time.py``). ``state``: ``slot``, a slot with paged entries as the engine's states
    are, or ``own``, the model's ``new_state`` (entries in a buffer of their own)."""
    model = build(cfg, dtype)
    ids = torch.randint(3, cfg.vocab_size, (1, tokens), generator=torch.Generator().manual_seed(0))
    fresh = model.new_state(1) if state == "own" else prefill_slots(model, tokens).new_state()

    def prefill() -> None:
        model(ForwardBatch.of(ids, fresh, num_logits=1))

    return counted_layers(model, prefill, where, {"prefill_tokens": tokens, "state": state})


def count_ragged(
    cfg: ModelConfig, tokens: int, spans: int, where: bool, dtype: torch.dtype
) -> dict[str, Any]:
    """Launches of one ragged pass: ``spans`` prompts of ``tokens`` each from fresh slot states,
    in one step (the engine's pass for several prompts, or prompts beside decode rows)."""
    model = build(cfg, dtype)
    slots = prefill_slots(model, tokens, spans)
    states = [slots.new_state() for _ in range(spans)]
    g = torch.Generator().manual_seed(0)
    chunks = [torch.randint(3, cfg.vocab_size, (tokens,), generator=g) for _ in states]

    def ragged() -> None:
        model(ForwardBatch.build(chunks, states))

    return counted_layers(model, ragged, where, {"ragged_tokens": tokens, "spans": spans})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["config_a", "v4_flash"], choices=list(MODELS))
    ap.add_argument("--batches", type=int, nargs="+", default=[1])
    ap.add_argument("--prompt-len", type=int, default=160)
    ap.add_argument("--label", default="run")
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--where", action="store_true", help="torch ops by the code calling them")
    ap.add_argument(
        "--prefill", type=int, nargs="+", default=[], help="also count prefill chunks of N tokens"
    )
    ap.add_argument(
        "--prefill-state", choices=("slot", "own"), default="slot",
        help="prefill into a slot with paged entries (the engine's) or the model's new_state",
    )  # fmt: skip
    ap.add_argument(
        "--ragged", type=int, nargs=2, default=None, metavar=("TOKENS", "SPANS"),
        help="also count one ragged pass of SPANS prompts of TOKENS each",
    )  # fmt: skip
    ap.add_argument(
        "--verify", type=int, default=0, metavar="K",
        help="also count a verification pass of rows of K drafts (plus the last token) per batch",
    )  # fmt: skip
    ap.add_argument("--skip-kernels", action="store_true", help="see skip_kernels")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if args.verify and args.skip_kernels:  # its pages are read at the top-k's picks
        ap.error("--verify reads kernel outputs on the host: run it without --skip-kernels")
    if args.skip_kernels:
        skip_kernels()
    result: dict[str, Any] = {
        "note": (
            "kernels of one decode step's layers (rows with prefill_tokens: one prefill chunk's "
            "from a fresh state): sm100 Triton launches (interpreted) and "
            "kernel-launching torch ops; under the interpreter hc_mix and the attention "
            "scores take their portable paths"
        ),
        "dtype": args.dtype,
        "kernels_run": not args.skip_kernels,
        "models": {},
    }
    for name in args.models:
        cfg = MODELS[name]()
        dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
        rows = [count_step(cfg, b, args.prompt_len, args.where, dtype) for b in args.batches]
        rows += [count_prefill(cfg, n, args.where, dtype, args.prefill_state) for n in args.prefill]
        if args.ragged:
            rows.append(count_ragged(cfg, *args.ragged, args.where, dtype))
        rows += [
            count_verify(cfg, b, args.verify, args.prompt_len, args.where, dtype)
            for b in (args.batches if args.verify else [])
        ]
        result["models"][name] = {"layers": cfg.num_hidden_layers, "rows": rows}
        for row in rows:
            if "verify_tokens" in row:
                what = f"verify batch {row['batch']} x {row['verify_tokens']}"
            elif "batch" in row:
                what = f"batch {row['batch']}"
            elif "spans" in row:
                what = f"ragged {row['spans']} x {row['ragged_tokens']}"
            else:
                what = f"prefill {row['prefill_tokens']}"
            print(
                f"{name} {what}: {row['kernels']} kernels "
                f"({row['triton_launches']} Triton, {row['torch_ops']} torch)",
                flush=True,
            )
    out = args.out or RESULTS / "launch_count_cpu.json"
    runs = json.loads(out.read_text()) if out.exists() else {"benchmark": "launch_count"}
    runs[args.label] = result
    write_result(runs, out, "launch_count_cpu")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
