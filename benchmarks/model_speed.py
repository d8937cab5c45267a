"""Model speed side by side: config A and a V4-Flash-width model, against their rooflines and HF.

Two models with random weights, one after the other in one process (each freed before the next):

* ``config_a``: config A of the model reference (``step_ab.midsize_config``, 2.1 B parameters),
  bf16, built as ``step_ab.py`` builds it (``init_random_weights`` on the ``--backend`` op
  table);
* ``v4_flash``: the published V4-Flash config (hidden 4096, 64 heads x 512, 256 routed experts
  top-6 of width 2048) cut to ``--flash-layers`` layers with dummy weights, loaded as
  ``low_precision.py`` loads it (``load_format="dummy"``, ``quantization="auto"``: FP8
  projections and FP4 experts where the backend computes on the stored formats).

For each model:

* decode: median ms of a step at each of ``--batches``, every sequence having prefilled
  ``--decode-prompt-len`` tokens, states as rows of shared slot tensors and CUDA graphs where the
  backend allows (``step_ab.time_decode``, as the engine runs a step);
* prefill: prompt tokens per second of one prompt of each of ``--prefill-lens`` as one chunk
  (``step_ab.time_prefill``); a length past the model's positions or the device's memory is
  skipped with the reason;
* rooflines: every decode figure against the bytes a step must read (non-expert weights, the
  routed experts a batch touches in expectation, E (1 - (1 - k/E)^B) of E at top-k, each at its
  held size, and the state the attention reads) at the measured copy bandwidth
  (``low_precision.copy_bandwidth``), and against its FLOPs at the measured bf16 matmul rate of a
  large square product; prefill as MFU against that rate. Bytes are counted from the built
  model's tensors, FLOPs from the logical shapes of a meta-device twin;
* a per-kernel profile of a few steps of each workload (torch.profiler; CUDA kernels on a GPU,
  CPU ops on the CPU): top kernels, kernels per step, GPU-busy fraction of the wall time;
* for config A only, HF transformers' ``DeepseekV4ForCausalLM`` holding the same weights (the
  state dict mapped through ``tools/export_hf.py``'s names), in the same process: decode tok/s
  from ``generate`` (``offline_throughput.time_hf``) at ``--hf-batches``, as the difference of
  ``--hf-new-tokens`` and one-token runs, and prefill of the shortest prompt. transformers has
  no FP8/FP4 kernels, so the V4-Flash-width model is measured on our side only.

The result goes to ``benchmarks/results/model_speed_<device>.json`` (``--out`` elsewhere), with
a roofline plot beside it (same name, ``.png``) where matplotlib is importable.

    python benchmarks/model_speed.py --device cuda [--models config_a v4_flash] [--no-hf]
    python benchmarks/model_speed.py --device cpu --small   # a check of the code paths

``--small`` shrinks both models (config A's structure at ``step_ab.small_config``'s size, the
V4-Flash config's layer schedule, routing and quantisation config at hidden 256) and every
shape, so a shared CPU runs it in a few minutes; its numbers mean nothing.
``--no-shared-fusion`` runs the shared experts as GEMMs of their own where the backend would
run them inside its grouped MoE kernels (``Backend.fuses_shared_expert``), for A/B runs.
"""

from __future__ import annotations

import argparse
import inspect
import json
import re
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
from _results import RESULTS, write_result
from low_precision import FLASH_CONFIG, copy_bandwidth, cut, median_s
from offline_throughput import time_hf
from step_ab import (
    StepApi,
    at_least,
    device_name,
    free_memory,
    midsize_config,
    pick_api,
    prefill_fresh,
    prefill_slots,
    small_config,
    sync,
    time_decode,
    time_prefill,
)
from torch import Tensor
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

import deepinfer

if TYPE_CHECKING:
    from deepinfer.config import ModelConfig
    from deepinfer.models.deepseek_v4 import DeepseekV4ForCausalLM
    from deepinfer.models.graphs import DecodeGraphs
    from deepinfer.models.state import ModelState

MODELS = ("config_a", "v4_flash")

#: Shapes of a full run and of ``--small`` (a CPU check of the code path, not a measurement).
DEFAULTS: dict[str, dict[str, Any]] = {
    "full": {
        "batches": [1, 8, 32, 64, 128, 256],
        "prefill_lens": [1024, 4096, 16384],
        "decode_prompt_len": 512,
        "warmup_steps": 5,
        "decode_steps": 20,
        "prefill_reps": 3,
        "prefill_group": 16,
        "hf_batches": [1, 8],
        "hf_new_tokens": 32,
        "hf_reps": 2,
        "profile_steps": 3,
        "repeats": 10,
        "matmul_n": 8192,
        "copy_bytes": 1 << 30,
    },
    "small": {
        "batches": [1, 2],
        "prefill_lens": [64, 128],
        "decode_prompt_len": 160,
        "warmup_steps": 2,
        "decode_steps": 3,
        "prefill_reps": 1,
        "prefill_group": 2,
        "hf_batches": [1],
        "hf_new_tokens": 4,
        "hf_reps": 1,
        "profile_steps": 2,
        "repeats": 3,
        "matmul_n": 512,
        "copy_bytes": 1 << 22,
    },
}

#: ``--small``'s V4-Flash: the published config's layer schedule, top-6 routing and FP8/FP4
#: quantisation config at a width a CPU runs in seconds (dims kept multiples of FP8's blocks).
SMALL_FLASH: dict[str, Any] = {
    "vocab_size": 4096,
    "hidden_size": 256,
    "num_attention_heads": 4,
    "head_dim": 128,
    "qk_rope_head_dim": 64,
    "q_lora_rank": 128,
    "o_groups": 2,
    "o_lora_rank": 128,
    "moe_intermediate_size": 128,
    "n_routed_experts": 16,
    "index_n_heads": 4,
    "index_head_dim": 64,
    "index_topk": 16,
    "sliding_window": 32,
}

#: The config fields a V4-Flash result records (what makes it "V4-Flash width").
FLASH_WIDTHS = (
    "hidden_size",
    "num_attention_heads",
    "head_dim",
    "n_routed_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
)

#: A routed expert's tensors (official names): ``layers.<i>.ffn.experts.<e>.<w>.<weight|scale>``.
EXPERT = re.compile(r"^layers\.(\d+)\.ffn\.experts\.\d+\.")
#: Tables a step reads one row of per token (embedding, hash routing's expert ids).
TOKEN_TABLES = ("embed.weight", "embed.scale", ".tid2eid")
#: Kernel rows kept per profile.
PROFILE_TOP = 12


# -- what a step reads and computes ---------------------------------------------------------------


class LayerShape(NamedTuple):
    """What one layer's attention reads per sequence, from the state ``new_state`` builds."""

    ratio: int  # compression ratio, 0: sliding window only
    indexed: bool  # a lightning indexer picks ``index_topk`` of the compressed entries
    swa_row_bytes: int
    entry_bytes: int
    index_entry_bytes: int


@dataclass(frozen=True)
class Footprint:
    """Bytes and FLOPs of the model's passes, counted from the built model.

    Bytes are the tensors as held (FP8/FP4 with their scales where the backend keeps the stored
    formats), so the byte roofline is that of the weights this run actually reads; FLOPs come
    from the logical shapes, which the held formats do not change. MTP layers are left out: a
    plain decode step does not run them.
    """

    cfg: ModelConfig
    #: Read every step whatever the batch: every non-expert weight but the token tables.
    dense_bytes: int
    #: One token's rows of the token tables.
    token_row_bytes: int
    #: Per main layer, one routed expert as held.
    expert_bytes: tuple[int, ...]
    #: Logical matmul weights a token meets outside the routed experts and the head.
    dense_params: int
    head_params: int
    #: Logical weights of one routed expert.
    expert_params: int
    layers: tuple[LayerShape, ...]
    held_bytes_by_dtype: dict[str, int] = field(default_factory=dict)

    def experts_touched(self, tokens: int) -> float:
        """Expected distinct experts of a layer that ``tokens`` independent top-k picks hit."""
        e, k = self.cfg.n_routed_experts, self.cfg.num_experts_per_tok
        return e * (1 - (1 - k / e) ** tokens)

    def weight_bytes(self, tokens: int) -> float:
        """Weight bytes a pass over ``tokens`` tokens reads at least once."""
        touched = self.experts_touched(tokens)
        experts = sum(touched * b for b in self.expert_bytes)
        return self.dense_bytes + tokens * self.token_row_bytes + experts

    def state_bytes(self, context: int) -> int:
        """State bytes one sequence's decode step reads at ``context`` tokens."""
        total = 0
        for layer in self.layers:
            total += min(context, self.cfg.sliding_window) * layer.swa_row_bytes
            if layer.ratio:
                n = context // layer.ratio
                if layer.indexed:
                    picked = min(n, self.cfg.index_topk)
                    total += picked * layer.entry_bytes + n * layer.index_entry_bytes
                else:
                    total += n * layer.entry_bytes
        return total

    def attention_flops(self, context: int) -> int:
        """One token's attention FLOPs at ``context`` tokens: scores and values over the window
        and the compressed entries it attends to (one shared kv head of ``head_dim``), plus the
        indexer's scores over every compressed entry of its layer."""
        cfg = self.cfg
        total = 0
        for layer in self.layers:
            keys = min(context, cfg.sliding_window)
            if layer.ratio:
                n = context // layer.ratio
                keys += min(n, cfg.index_topk) if layer.indexed else n
                if layer.indexed:
                    total += 2 * cfg.index_n_heads * cfg.index_head_dim * n
            total += 4 * cfg.num_attention_heads * cfg.head_dim * keys
        return total

    def token_matmul_flops(self) -> int:
        """Matmul FLOPs of one token through the layers (the head not included)."""
        routed = self.cfg.num_experts_per_tok * self.expert_params * len(self.expert_bytes)
        return 2 * (self.dense_params + routed)

    def decode_bytes(self, batch: int, context: int) -> float:
        """Bytes a decode step of ``batch`` sequences at ``context`` tokens must read."""
        return self.weight_bytes(batch) + batch * self.state_bytes(context)

    def decode_flops(self, batch: int, context: int) -> int:
        """FLOPs of that step: every row through the layers and the head, and its attention."""
        per_token = self.token_matmul_flops() + 2 * self.head_params
        return batch * (per_token + self.attention_flops(context))

    def prefill_flops(self, tokens: int) -> int:
        """One prompt of ``tokens``: every token through the layers, the head for the last
        token only (as the prefill computes it), attention at each position's context."""
        attention = sum(self.attention_flops(p) for p in range(1, tokens + 1))
        return tokens * self.token_matmul_flops() + 2 * self.head_params + attention

    def summary(self) -> dict[str, Any]:
        """The counts behind every row's bounds, so a result file can be checked by hand."""
        gib = 2**30
        return {
            "dense_weights_gib": round(self.dense_bytes / gib, 3),
            "routed_expert_mib": round(statistics.mean(self.expert_bytes) / 2**20, 3),
            "routed_experts_gib": round(
                sum(self.expert_bytes) * self.cfg.n_routed_experts / gib, 3
            ),
            "token_row_bytes": self.token_row_bytes,
            "held_gib_by_dtype": {
                k: round(v / gib, 3) for k, v in self.held_bytes_by_dtype.items()
            },
            "active_params_per_token_b": round(
                (self.token_matmul_flops() / 2 + self.head_params) / 1e9, 4
            ),
            "state_mib_per_sequence_at_1k": round(self.state_bytes(1024) / 2**20, 3),
        }


def footprint(model: DeepseekV4ForCausalLM) -> Footprint:
    """Count :class:`Footprint` from ``model``'s state dict (as held), a meta-device twin of it
    (logical shapes) and one fresh state (the attention state's row sizes and dtypes)."""
    dense = row = 0
    experts: Counter[int] = Counter()
    by_dtype: Counter[str] = Counter()
    for name, t in model.state_dict(keep_vars=True).items():
        if name.startswith("mtp."):
            continue
        nbytes = t.numel() * t.element_size()
        by_dtype[str(t.dtype).removeprefix("torch.")] += nbytes
        if match := EXPERT.match(name):
            experts[int(match[1])] += nbytes
        elif name.endswith(TOKEN_TABLES):
            row += nbytes // t.shape[0]
        else:
            dense += nbytes
    n_experts = model.cfg.n_routed_experts
    params: Counter[str] = Counter()
    twin = type(model)(model.cfg, dtype=model.dtype, device="meta")
    for name, t in twin.state_dict(keep_vars=True).items():
        matmul = t.is_floating_point() and t.dim() == 2 and not name.endswith(".ape")
        if name.startswith("mtp.") or name.endswith(TOKEN_TABLES) or not matmul:
            continue
        kind = "expert" if EXPERT.match(name) else "head" if name == "head.weight" else "dense"
        params[kind] += t.numel()
    del twin
    return Footprint(
        cfg=model.cfg,
        dense_bytes=dense,
        token_row_bytes=row,
        expert_bytes=tuple(experts[i] // n_experts for i in sorted(experts)),
        dense_params=params["dense"],
        head_params=params["head"],
        expert_params=params["expert"] // max(1, n_experts * len(experts)),
        layers=state_layout(model),
        held_bytes_by_dtype=dict(by_dtype),
    )


def state_layout(model: DeepseekV4ForCausalLM) -> tuple[LayerShape, ...]:
    """Per main layer, the bytes of a window row and of a compressed (and index) entry, read
    off a one-sequence state, so the state's dtypes are whatever the model keeps."""
    state = model.new_state(1)
    shapes = []
    for layer in state.layers:
        ring = layer.swa.kv
        comp, index = layer.compressor, layer.indexer
        shapes.append(
            LayerShape(
                ratio=comp.ratio if comp is not None else 0,
                indexed=index is not None,
                swa_row_bytes=ring.shape[-1] * ring.element_size(),
                entry_bytes=comp.entry_dim * comp.entry_dtype.itemsize if comp else 0,
                index_entry_bytes=index.entry_dim * index.entry_dtype.itemsize if index else 0,
            )
        )
    del state
    return tuple(shapes)


# -- rooflines ------------------------------------------------------------------------------------


def matmul_rate(device: str, n: int, repeats: int) -> float:
    """FLOP/s of a bf16 [n, n] x [n, n] product, median of ``repeats`` after a warm-up: the
    rate the FLOPs bounds and MFU are quoted against (a measured ceiling, not a data sheet)."""
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    return 2 * n**3 / median_s(lambda: a @ b, device, repeats)


def rooflines(args: argparse.Namespace, device: str) -> dict[str, Any]:
    """The two ceilings every figure is set against, measured on this device in this run."""
    bandwidth = copy_bandwidth(device, args.repeats, args.copy_bytes)
    rate = matmul_rate(device, args.matmul_n, args.repeats)
    free_memory(device)
    return {
        "copy_bandwidth_gb_s": sig(bandwidth / 1e9),
        "copy_bytes": args.copy_bytes,
        "matmul_tflops": sig(rate / 1e12),
        "matmul": f"bf16 [{args.matmul_n}]^2 x [{args.matmul_n}]^2, median of {args.repeats}",
        "bandwidth_b_per_s": bandwidth,
        "matmul_flop_per_s": rate,
    }


def sig(value: float, digits: int = 4) -> float:
    """``value`` to ``digits`` significant digits: the same fields hold GPU and CPU figures,
    which differ by orders of magnitude, so a fixed number of decimals would zero the small."""
    return float(f"{value:.{digits}g}")


def against(nbytes: float, flops: float, seconds: float, rates: dict[str, Any]) -> dict[str, Any]:
    """A measured decode step against the byte and FLOP bounds: ``roofline_fraction`` is the
    larger bound over the time (1 = at the roofline)."""
    bytes_ms = nbytes / rates["bandwidth_b_per_s"] * 1e3
    flops_ms = flops / rates["matmul_flop_per_s"] * 1e3
    return {
        "bytes_per_step": round(nbytes),
        "gflop_per_step": sig(flops / 1e9),
        "flop_per_byte": sig(flops / nbytes),
        "bytes_bound_ms": sig(bytes_ms),
        "flops_bound_ms": sig(flops_ms),
        "bound": "bytes" if bytes_ms >= flops_ms else "flops",
        "roofline_fraction": sig(max(bytes_ms, flops_ms) / (seconds * 1e3)),
        "achieved_tflops": sig(flops / seconds / 1e12),
    }


def prefill_figures(
    fp: Footprint, tokens: int, seconds: float, rates: dict[str, Any]
) -> dict[str, Any]:
    """A measured prefill of one ``tokens`` prompt: throughput and MFU (its FLOPs per second
    over the measured matmul rate); the FLOP per byte of the weights it reads places it on
    the plot."""
    flops = fp.prefill_flops(tokens)
    return {
        "tokens": tokens,
        "tok_per_s": sig(tokens / seconds, 6),
        "gflop": sig(flops / 1e9),
        "achieved_tflops": sig(flops / seconds / 1e12),
        "mfu": sig(flops / seconds / rates["matmul_flop_per_s"]),
        "flop_per_byte": sig(flops / fp.weight_bytes(tokens)),
    }


# -- profiles -------------------------------------------------------------------------------------


def activities(device: str) -> list[ProfilerActivity]:
    """CUDA kernels on a GPU (plus the host side that launches them), CPU ops otherwise."""
    if device.startswith("cuda"):
        return [ProfilerActivity.CPU, ProfilerActivity.CUDA]
    return [ProfilerActivity.CPU]


def kernel_sequence(prof: profile, steps: int) -> list[tuple[str, float, float]]:
    """One profiled step's GPU kernels in launch order: (name, us, idle us before it). The
    last step's (the first may follow a capture or a warm-up); :func:`kernel_table` totals
    hide which kernels repeat where in a layer, and which could be one."""
    kernels = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
    kernels = sorted(
        (e for e in kernels if e.time_range.elapsed_us() > 0), key=lambda e: e.time_range.start
    )
    per = len(kernels) // max(steps, 1)
    step = kernels[len(kernels) - per :]
    out, end = [], None
    for e in step:
        idle = 0.0 if end is None else e.time_range.start - end
        out.append((e.name[:120], round(e.time_range.elapsed_us(), 2), round(idle, 2)))
        end = e.time_range.end
    return out


def kernel_table(
    prof: profile, device: str, steps: int, wall_s: float, sequence: bool = False
) -> dict[str, Any]:
    """Top kernels by total time, kernels per step and the busy fraction of the profiled wall
    time. On a GPU each kernel's time is its span on the device (graph replays included); on
    the CPU the rows are aten ops by self time (nested ops counted as calls too). ``sequence``
    (a GPU only): also one step's kernels in order (:func:`kernel_sequence`)."""
    cuda = device.startswith("cuda")
    calls: Counter[str] = Counter()
    total: Counter[str] = Counter()
    for event in prof.events():
        if cuda and event.device_type == DeviceType.CUDA:
            us = event.time_range.elapsed_us()
        elif not cuda and not event.name.startswith("ProfilerStep"):
            us = event.self_cpu_time_total
        else:
            continue
        if us > 0:
            calls[event.name] += 1
            total[event.name] += us
    busy = sum(total.values())
    return {
        "activity": "cuda kernels" if cuda else "cpu ops",
        "steps": steps,
        "wall_us": round(wall_s * 1e6, 1),
        "busy_us": round(busy, 1),
        "busy_fraction": round(busy / (wall_s * 1e6), 4) if wall_s else None,
        "kernels_per_step": round(calls.total() / steps, 1),
        "distinct_kernels": len(total),
        "top": [
            {
                "name": name[:160],
                "calls": calls[name],
                "total_us": round(us, 1),
                "share": round(us / busy, 4),
            }
            for name, us in total.most_common(PROFILE_TOP)
        ],
    } | ({"sequence": kernel_sequence(prof, steps)} if sequence and cuda else {})


def profile_calls(
    call: Callable[[], object], steps: int, device: str, sequence: bool = False
) -> dict[str, Any]:
    """Profile ``steps`` calls of ``call`` (already warm), each timed between device syncs
    (``sequence``: with one call's kernels in order)."""
    wall = 0.0
    with profile(activities=activities(device)) as prof:
        for _ in range(steps):
            sync(device)
            start = time.perf_counter()
            call()
            sync(device)
            wall += time.perf_counter() - start
    return kernel_table(prof, device, steps, wall, sequence)


def profiled_api(
    api: StepApi, *, prof: profile, first: int, steps: int, device: str, wall: list[float]
) -> StepApi:
    """``api`` with its decode steps ``first`` .. ``first + steps - 1`` profiled and timed, so
    ``time_decode`` sets the slots, prompts and graphs up as it does when it times, and the
    profile covers only steps after the capture (the earlier ones warm up)."""
    calls = [0]

    def decode_step(
        model: DeepseekV4ForCausalLM,
        ids: Tensor,
        states: Sequence[ModelState],
        graphs: DecodeGraphs | None,
    ) -> Tensor:
        i = calls[0]
        calls[0] += 1
        if i == first:
            prof.start()
        sync(device)
        start = time.perf_counter()
        logits = api.decode_step(model, ids, states, graphs)
        sync(device)
        if first <= i < first + steps:
            wall.append(time.perf_counter() - start)
        if i == first + steps - 1:
            prof.stop()
        return logits

    return StepApi(f"{api.name}, profiled", decode_step, api.prefill)


def profile_decode(
    model: DeepseekV4ForCausalLM, api: StepApi, batch: int, run: argparse.Namespace, top: int
) -> dict[str, Any]:
    """A few captured decode steps at ``batch`` under the profiler, in a setup of their own (the
    timed run stays free of the profiler's hooks)."""
    first = 2  # the first call captures the graph, the second replays it warm
    steps = run.profile_steps
    shaped = argparse.Namespace(**{**vars(run), "warmup_steps": first, "decode_steps": steps})
    prof = profile(activities=activities(run.device))
    wall: list[float] = []
    time_decode(
        model,
        profiled_api(api, prof=prof, first=first, steps=steps, device=run.device, wall=wall),
        batch,
        shaped,
        top,
    )
    return kernel_table(prof, run.device, steps, sum(wall), run.kernel_sequence)


# -- our side -------------------------------------------------------------------------------------


def decode_row(
    model: DeepseekV4ForCausalLM,
    api: StepApi,
    fp: Footprint,
    batch: int,
    *,
    run: argparse.Namespace,
    rates: dict[str, Any],
) -> dict[str, Any]:
    """One batch size: the timed steps, their rooflines, and (unless ``--no-profile``) a
    profile of a few more."""
    device, top = run.device, run.top
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    step = time_decode(model, api, batch, run, top)
    row: dict[str, Any] = {
        "batch": batch,
        "ms": step["ms"],
        "tok_per_s": round(batch / step["ms"] * 1e3, 1),
        "ms_all": step["ms_all"],
        "cuda_graphs": step["cuda_graphs"],
        "experts_touched_per_layer": round(fp.experts_touched(batch), 2),
    }
    if cuda:
        row["peak_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
    context = run.decode_prompt_len
    nbytes, flops = fp.decode_bytes(batch, context), fp.decode_flops(batch, context)
    row |= against(nbytes, flops, step["ms"] / 1e3, rates)
    free_memory(device)
    if run.profile:
        row["profile"] = profile_decode(model, api, batch, run, top)
        free_memory(device)
    print(f"  decode B={batch}: {row['ms']} ms, {row['roofline_fraction']}", file=sys.stderr)
    return row


def prefill_row(
    model: DeepseekV4ForCausalLM,
    api: StepApi,
    fp: Footprint,
    tokens: int,
    *,
    run: argparse.Namespace,
    rates: dict[str, Any],
) -> dict[str, Any]:
    """One prompt of ``tokens`` as one chunk: throughput and MFU; skipped with the reason where
    the model has no such positions or the device runs out of memory."""
    device = run.device
    limit = model.cfg.max_position_embeddings
    if tokens > limit:
        return {"tokens": tokens, "skipped": f"beyond max_position_embeddings {limit}"}
    g = torch.Generator().manual_seed(run.seed + tokens)
    ids = torch.randint(3, run.top, (tokens,), generator=g).to(device)
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    reason = None
    slots = prefill_slots(model, tokens) if run.prefill_state == "slot" else None
    try:
        times = time_prefill(model, api, ids, run.prefill_reps, device, slots)
    except torch.cuda.OutOfMemoryError as exc:
        reason = f"out of memory: {str(exc).splitlines()[0]}"
    if reason is not None:  # freed here, once the exception no longer holds the frames
        free_memory(device)
        return {"tokens": tokens, "skipped": reason}
    row = prefill_figures(fp, tokens, statistics.median(times), rates)
    row["s_all"] = [round(t, 4) for t in times]
    row["state"] = run.prefill_state
    if cuda:
        row["peak_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
    if run.profile:
        row["profile"] = profile_calls(
            lambda: prefill_fresh(model, api, ids, slots), 1, device, run.kernel_sequence
        )
    free_memory(device)
    print(f"  prefill {tokens}: {row['tok_per_s']} tok/s, MFU {row['mfu']}", file=sys.stderr)
    return row


def measure(
    model: DeepseekV4ForCausalLM, run: argparse.Namespace, rates: dict[str, Any]
) -> dict[str, Any]:
    """Decode and prefill of one built model, with what its steps read and compute."""
    api = pick_api(model, "new")
    fp = footprint(model)
    out: dict[str, Any] = {
        "api": api.name,
        "params": sum(p.numel() for p in model.parameters()),
        "held_weights_gib": round(
            sum(t.numel() * t.element_size() for t in model.state_dict().values()) / 2**30, 3
        ),
        "footprint": fp.summary(),
    }
    with torch.inference_mode():  # as the engine runs its steps
        out["decode"] = [decode_row(model, api, fp, b, run=run, rates=rates) for b in run.batches]
        out["prefill"] = [
            prefill_row(model, api, fp, n, run=run, rates=rates) for n in run.prefill_lens
        ]
    return out


# -- transformers on the same weights -------------------------------------------------------------


def hf_twin(model: DeepseekV4ForCausalLM, device: str) -> Any:
    """transformers' ``DeepseekV4ForCausalLM`` (bf16) holding ``model``'s weights.

    ``tools/export_hf.py`` maps transformers' state dict to the official names by renaming and
    slicing only, so the tensors it returns are views of transformers' parameters: copying our
    tensor of each official name into them fills the model. Its config is ours as published
    (transformers reads ``compress_ratios`` and ``num_hash_layers``); MTP has no counterpart.
    """
    from export_hf import official_state_dict  # tools/, on the path via offline_throughput
    from transformers import DeepseekV4Config, DeepseekV4ForCausalLM

    raw = {k: v for k, v in model.cfg.to_dict().items() if k != "architectures"}
    with torch.device(device):
        hf = DeepseekV4ForCausalLM._from_config(DeepseekV4Config(**raw), dtype=torch.bfloat16)
    hf = hf.to(device).eval()
    targets = official_state_dict(hf.state_dict())
    ours = model.state_dict()
    missing = sorted(set(targets) - set(ours))
    if missing:
        raise RuntimeError(f"transformers tensors without a counterpart in ours: {missing[:8]}")
    with torch.no_grad():
        for name, target in targets.items():
            target.copy_(ours[name])
    return hf


def hf_agreement(hf: Any, model: DeepseekV4ForCausalLM, top: int, device: str) -> dict[str, Any]:
    """Last-token logits of one short prompt from both models: evidence that the weights moved
    over intact (bf16 on both sides, so they agree to bf16 rounding, not bit for bit)."""
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(3, top, (1, 32), generator=g).to(device)
    with torch.inference_mode():
        theirs = hf(ids).logits[0, -1].float()
        ours = model.forward_logits(ids)[0, -1].float()
    return {
        "prompt_tokens": 32,
        "max_abs_logit_diff": round(float((theirs - ours).abs().max()), 4),
        "max_abs_logit": round(float(ours.abs().max()), 4),
        "argmax_equal": bool(theirs.argmax() == ours.argmax()),
    }


def hf_decode_row(
    hf: Any, fp: Footprint, batch: int, run: argparse.Namespace, rates: dict[str, Any]
) -> dict[str, Any]:
    """transformers' decode at ``batch`` through ``generate``: a step's time is the difference
    of an N-token and a one-token run over N - 1, so its prefill cancels out."""
    device, n = run.device, run.hf_new_tokens
    g = torch.Generator().manual_seed(run.seed + batch)
    prompts = torch.randint(3, run.top, (batch, run.decode_prompt_len), generator=g).to(device)
    time_hf(hf, prompts[:, :8], 2)  # warm-up
    one = statistics.median(time_hf(hf, prompts, 1) for _ in range(run.hf_reps))
    many = statistics.median(time_hf(hf, prompts, n) for _ in range(run.hf_reps))
    row: dict[str, Any] = {
        "batch": batch,
        "new_tokens": n,
        "generate_1_s": round(one, 4),
        f"generate_{n}_s": round(many, 4),
    }
    if many <= one:
        row["skipped"] = "the N-token run was not slower than the one-token run (noise)"
        return row
    step_s = (many - one) / (n - 1)
    row["ms"] = round(step_s * 1e3, 3)
    row["tok_per_s"] = round(batch / step_s, 1)
    context = run.decode_prompt_len
    row |= against(fp.decode_bytes(batch, context), fp.decode_flops(batch, context), step_s, rates)
    if run.profile:
        row["profile"] = profile_calls(hf_step(hf, prompts), run.profile_steps, device)
    free_memory(device)
    print(f"  HF decode B={batch}: {row['ms']} ms", file=sys.stderr)
    return row


def hf_step(hf: Any, prompts: Tensor) -> Callable[[], object]:
    """One cached transformers decode step after prefilling ``prompts`` (what ``generate`` runs
    per token, sampling aside); each call appends the same last token to the cache.

    transformers 5.2x renamed the cache argument and output from ``past_key_values`` to
    ``cache``; whichever this version's forward takes is used."""
    key = "cache" if "cache" in inspect.signature(hf.forward).parameters else "past_key_values"
    with torch.no_grad():
        cache = getattr(hf(prompts, use_cache=True), key)
    last = prompts[:, -1:]

    def call() -> object:
        with torch.no_grad():
            return hf(last, use_cache=True, **{key: cache})

    return call


def hf_prefill_row(
    hf: Any, fp: Footprint, tokens: int, run: argparse.Namespace, rates: dict[str, Any]
) -> dict[str, Any]:
    """transformers' prefill of one ``tokens`` prompt: ``generate`` of one token."""
    g = torch.Generator().manual_seed(run.seed + tokens)
    ids = torch.randint(3, run.top, (1, tokens), generator=g).to(run.device)
    time_hf(hf, ids, 1)  # warm-up
    seconds = statistics.median(time_hf(hf, ids, 1) for _ in range(run.hf_reps))
    row = prefill_figures(fp, tokens, seconds, rates)
    if run.profile:
        with torch.no_grad():
            row["profile"] = profile_calls(lambda: hf(ids), 1, run.device)
    free_memory(run.device)
    return row


def hf_peer(
    model: DeepseekV4ForCausalLM,
    ours: dict[str, Any],
    run: argparse.Namespace,
    rates: dict[str, Any],
) -> dict[str, Any]:
    """transformers on config A's weights, beside our figures (``speedup`` = ours / theirs)."""
    if not run.hf:
        return {"skipped": "--no-hf"}
    try:
        import transformers
        from transformers import DeepseekV4ForCausalLM  # noqa: F401
    except ImportError as exc:
        return {"skipped": f"transformers' deepseek_v4 is not importable: {exc}"}
    hf = hf_twin(model, run.device)
    fp = footprint(model)
    out: dict[str, Any] = {
        "transformers": transformers.__version__,
        "dtype": "bfloat16",
        "attn_implementation": getattr(hf.config, "_attn_implementation", None),
        "agreement": hf_agreement(hf, model, run.top, run.device),
        "decode": [hf_decode_row(hf, fp, b, run, rates) for b in run.hf_batches],
        "prefill": hf_prefill_row(hf, fp, min(run.prefill_lens), run, rates),
    }
    ours_decode = {r["batch"]: r for r in ours["decode"]}
    for row in out["decode"]:
        mine = ours_decode.get(row["batch"])
        if mine is not None and "tok_per_s" in row:
            row["speedup"] = round(mine["tok_per_s"] / row["tok_per_s"], 2)
    prefill = {r["tokens"]: r for r in ours["prefill"]}.get(out["prefill"]["tokens"], {})
    if "tok_per_s" in prefill:
        out["prefill"]["speedup"] = round(prefill["tok_per_s"] / out["prefill"]["tok_per_s"], 2)
    del hf
    free_memory(run.device)
    return out


# -- the two models -------------------------------------------------------------------------------


@torch.no_grad()
def hold_as_checkpoint(model: torch.nn.Module) -> None:
    """The projections computed in fp32 (head, router gates, compressors) rounded to bf16, as
    a checkpoint stores them, then held as the engine holds such a checkpoint's
    (:func:`~deepinfer.models.hold_computed_formats`): random fp32 draws would keep them fp32.
    Then what a load does once the weights are in (:func:`~deepinfer.models.weights_loaded`):
    on a backend that asks for it, projections of one input fused into one GEMM, so the steps
    timed here launch what the engine's do."""
    from deepinfer.models import hold_computed_formats, weights_loaded
    from deepinfer.models.stored_formats import fp32_projections

    for _, module in fp32_projections(model):
        module.weight.copy_(module.weight.to(torch.bfloat16))
    hold_computed_formats(model, "auto")  # type: ignore[arg-type]
    weights_loaded(model)  # type: ignore[arg-type]


def load_backend(run: argparse.Namespace) -> Any:
    """The ``--backend`` op table on the device, its shared-expert fusion off with
    ``--no-shared-fusion``."""
    from deepinfer import plugins

    ops = plugins.backends.load(run.backend)(run.device)
    ops.fuses_shared_expert &= run.shared_fusion
    return ops


def run_config_a(run: argparse.Namespace, rates: dict[str, Any]) -> dict[str, Any]:
    """Config A (``small_config`` with ``--small``), built and drawn as ``step_ab.py`` does,
    then transformers on its weights."""
    from deepinfer.assets import init_random_weights
    from deepinfer.models.deepseek_v4 import DeepseekV4ForCausalLM

    cfg = small_config() if run.small else midsize_config()
    ops = load_backend(run)
    model = DeepseekV4ForCausalLM(cfg, dtype=torch.bfloat16, device=run.device, backend=ops)
    init_random_weights(model, seed=0)  # drawn on the CPU: the same weights on every device
    hold_as_checkpoint(model)
    model.eval()
    run.top = min(cfg.vocab_size, cfg.image_token_id or cfg.vocab_size)
    print("config_a", file=sys.stderr)
    out: dict[str, Any] = {
        "config": "step_ab.small_config (shrunk)" if run.small else "step_ab.midsize_config",
        "dtype": "bfloat16",
        **measure(model, run, rates),
    }
    out["hf"] = hf_peer(model, out, run, rates)
    del model, ops
    return out


def flash_config(run: argparse.Namespace) -> dict[str, Any]:
    """The published V4-Flash config cut to ``--flash-layers`` (``low_precision.cut``), its
    widths replaced by :data:`SMALL_FLASH`'s with ``--small``."""
    raw = json.loads(FLASH_CONFIG.read_text())
    if run.small:
        raw |= SMALL_FLASH
    return cut(raw, run.flash_layers)


def run_flash(run: argparse.Namespace, rates: dict[str, Any]) -> dict[str, Any]:
    """The V4-Flash-width model loaded as ``low_precision.time_model`` loads it: dummy weights,
    stored formats kept where the backend computes on them."""
    from deepinfer.loading import load
    from deepinfer.models.deepseek_v4 import DeepseekV4ForCausalLM

    raw = flash_config(run)
    backend = load_backend(run)
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "config.json").write_text(json.dumps(raw))
        net, _ = load(
            tmp, "bfloat16", run.device, backend, load_format="dummy", quantization="auto"
        )
    if not isinstance(net, DeepseekV4ForCausalLM):
        raise TypeError(f"the V4-Flash config built a {type(net).__name__}")
    net.eval()
    run.top = net.cfg.vocab_size
    print("v4_flash", file=sys.stderr)
    source = FLASH_CONFIG.relative_to(FLASH_CONFIG.parents[3])
    out: dict[str, Any] = {
        "config": f"{source} cut to {run.flash_layers} layers",
        "small": "shrunken config (SMALL_FLASH widths), not skipped" if run.small else None,
        "widths": {k: raw[k] for k in FLASH_WIDTHS},
        "quantization": "auto",
        "native_formats": sorted(net.ops.native_formats),
        **measure(net, run, rates),
        "hf": {
            "skipped": "transformers has no FP8/FP4 kernels: the V4-Flash-width model, held in "
            "its stored formats, is measured on our side only"
        },
    }
    del net, backend
    return out


# -- plot -----------------------------------------------------------------------------------------


def plot(result: dict[str, Any], path: Path) -> str:
    """A roofline plot (achieved TFLOP/s against FLOP per byte) of every decode and prefill
    figure, ours and transformers'; returns the path, or why there is none."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        return f"skipped: matplotlib is not importable ({exc})"
    rates = result["rooflines"]
    peak, bandwidth = rates["matmul_tflops"], rates["copy_bandwidth_gb_s"] / 1e3
    fig, ax = plt.subplots(figsize=(9, 6))
    points = []
    for name, body in result["models"].items():
        for side, src in (("ours", body), ("HF", body.get("hf", {}))):
            for row in src.get("decode", []):
                points.append((f"{name} {side}", f"B{row['batch']}", row))
            prefill = src.get("prefill", [])
            for row in prefill if isinstance(prefill, list) else [prefill]:
                points.append((f"{name} {side} prefill", f"{row['tokens']}", row))
    points = [p for p in points if "achieved_tflops" in p[2]]
    spread = [p[2]["flop_per_byte"] for p in points] or [1.0]
    low, high = min(spread) / 4, max(spread) * 4
    x = [low * (high / low) ** (i / 99) for i in range(100)]
    ax.plot(x, [min(peak, bandwidth * xi) for xi in x], color="black", label="roofline")
    for series in dict.fromkeys(p[0] for p in points):
        mine = [p for p in points if p[0] == series]
        xs = [p[2]["flop_per_byte"] for p in mine]
        ys = [p[2]["achieved_tflops"] for p in mine]
        ax.scatter(xs, ys, label=series)
        for xi, yi, (_, tag, _) in zip(xs, ys, mine, strict=True):
            ax.annotate(tag, (xi, yi), fontsize=7)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("FLOP per byte read")
    ax.set_ylabel("achieved TFLOP/s")
    ax.set_title(f"{result['device_name']}, {result['backend']} backend")
    ax.legend(fontsize=8)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return str(path)


# -- main -----------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--small", action="store_true", help="tiny shapes: a CPU check")
    ap.add_argument("--backend", default=None, help="default: select_backend's pick")
    ap.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    ap.add_argument("--flash-layers", type=at_least(1), default=4)
    for name in ("batches", "prefill-lens", "hf-batches"):
        ap.add_argument(f"--{name}", type=at_least(1), nargs="+", default=None)
    for name, low in (
        ("decode-prompt-len", 1),
        ("decode-steps", 1),
        ("warmup-steps", 0),
        ("prefill-reps", 1),
        ("hf-new-tokens", 2),
        ("profile-steps", 1),
        ("repeats", 1),
    ):
        ap.add_argument(f"--{name}", type=at_least(low), default=None, help="default: DEFAULTS")
    ap.add_argument("--no-hf", dest="hf", action="store_false", help="skip transformers")
    ap.add_argument("--no-profile", dest="profile", action="store_false", help="skip profiles")
    ap.add_argument(
        "--no-shared-fusion", dest="shared_fusion", action="store_false",
        help="shared experts as GEMMs of their own, not in the grouped MoE kernels",
    )  # fmt: skip
    ap.add_argument(
        "--kernel-sequence", action="store_true",
        help="profiles also list one step's kernels in order (a GPU only)",
    )  # fmt: skip
    ap.add_argument(
        "--prefill-state", choices=("slot", "own"), default="slot",
        help="prefill into a slot state with paged entries, as the engine does, or the "
        "model's own new_state (the figures before this option)",
    )  # fmt: skip
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None, help="default: results/model_speed_*.json")
    args = ap.parse_args(argv)
    for key, value in DEFAULTS["small" if args.small else "full"].items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    return args


def run_namespace(args: argparse.Namespace, device: str, backend: str) -> argparse.Namespace:
    """The options plus what ``step_ab.time_decode`` reads (``device``, ``max_len``: room for
    the prompt and every step, timed or profiled, so no step grows the slot tensors)."""
    steps = max(args.warmup_steps, 2) + max(args.decode_steps, args.profile_steps)
    return argparse.Namespace(
        **{**vars(args), "device": device, "backend": backend},
        max_len=args.decode_prompt_len + steps + 1,
        top=0,  # set per model
    )


def main(argv: Sequence[str] | None = None) -> int:
    from deepinfer.device import select_backend

    args = parse_args(argv)
    choice = select_backend(args.device)
    run = run_namespace(args, choice.device, args.backend or choice.backend)
    rates = rooflines(run, run.device)
    models: dict[str, Any] = {}
    for name, runner in (("config_a", run_config_a), ("v4_flash", run_flash)):
        if name not in args.models:
            models[name] = {"skipped": "not in --models"}
            continue
        models[name] = runner(run, rates)  # the model is unreferenced once it returns
        free_memory(run.device)
    try:
        import transformers

        hf_version: str | None = transformers.__version__
    except ImportError:
        hf_version = None
    result: dict[str, Any] = {
        "benchmark": "model_speed",
        "small": args.small,
        "deepinfer": str(Path(deepinfer.__file__).resolve()),
        "torch": torch.__version__,
        "transformers": hf_version,
        "device": run.device,
        "device_name": device_name(run.device),
        "backend": run.backend,
        "backend_reason": choice.reason if args.backend is None else "--backend",
        "args": vars(args) | {"out": str(args.out) if args.out else None},
        "rooflines": {k: v for k, v in rates.items() if not k.endswith("_per_s")},
        "models": models,
        "notes": NOTES,
    }
    name = f"model_speed_{run.device.split(':')[0]}" + ("_small" if args.small else "")
    path = args.out or RESULTS / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    result["plot"] = plot(result, path.with_suffix(".png"))
    write_result(result, path, name)
    return 0


#: How the figures are counted, written into every result.
NOTES = [
    "decode bytes: non-expert weights as held (MTP and token tables out) + the token tables' "
    "rows + E (1 - (1 - k/E)^B) routed experts per layer as held + each sequence's attention "
    "state at --decode-prompt-len (window rows, the compressed entries attended to, every index "
    "key of an indexed layer); against the copy bandwidth, which counts read + written bytes",
    "FLOPs: 2 x logical matmul weights per token (the head once per decode row, once per "
    "prefill) + attention scores and values over the keys attended to + indexer scores",
    "roofline_fraction = max(bytes_bound_ms, flops_bound_ms) / measured ms; mfu = FLOPs / s "
    "over the measured bf16 matmul rate",
    "HF decode: (generate of N tokens - generate of 1) / (N - 1), same prompt length",
    "profiles: on CUDA each kernel's span on the device (graph replays included); on the CPU "
    "aten ops by self time; busy_fraction = kernel time / profiled wall time (profiler on)",
]


if __name__ == "__main__":
    raise SystemExit(main())
