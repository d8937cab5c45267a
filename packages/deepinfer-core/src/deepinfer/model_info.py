"""The model report behind ``deepinfer info --model DIR``: weights, state and GPUs needed.

Sizing a deployment needs the weights' bytes in their stored formats, one sequence's state
bytes at a given length, and the GPUs the two need together. All come from config.json alone:
the model is built on the ``meta`` device (no memory, no weights read), so the names and shapes
are the ones the loader fills and cannot drift from a hand-written formula.

Stored formats follow docs/model-deepseek-v4.md §6.1/§6.3 and §5.9: attention, shared-expert,
indexer ``wq_b``, MTP ``e_proj``/``h_proj`` and Engram ``wkv`` projections are FP8 e4m3 with one
scale per block (``weight_block_size``; ue8m0 = 1 byte, otherwise fp32 = 4 bytes, as in -Base);
routed experts are FP4 e2m1 (two per byte) with one ue8m0 byte per 32 values when
``expert_dtype`` is ``fp4``, else FP8 blocks; Engram tables are FP8 with one e8m0 byte per 32;
mHC, norms, sinks, position biases and router biases are fp32; everything else is bf16. A
config without ``quantization_config`` describes a bf16 checkpoint. Sizes are GiB (2**30 B).
The GPUs are counted on what DeepInfer holds with ``quantization="auto"`` on the stored-format
kernels: the stored formats, plus what the model keeps wider than the checkpoint (the router
gates, compressor projections and LM head in fp32).
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from deepinfer.backends.torch_ref import TorchBackend
from deepinfer.cache.pools import state_bytes
from deepinfer.config import ModelConfig
from deepinfer.models.checkpoint_config import quant_settings, read_config
from deepinfer.models.stored_formats import stored_format

GIB = 2**30
#: (kind, pattern on the name without its ``layers.N.`` prefix), first match wins.
_KINDS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (kind, re.compile(pattern))
    for kind, pattern in (
        ("routed_experts", r"ffn\.experts\."),
        ("shared_experts", r"ffn\.shared_experts\."),
        ("router", r"ffn\.gate\."),
        ("engram_table", r"engram\.embed\."),
        ("engram_other", r"engram\."),
        ("indexer", r"attn\.indexer\."),
        ("compressor", r"attn\.compressor\."),
        ("attention", r"^attn\."),
        ("mhc", r"(^|\.)hc_"),
        ("norms", r"norm\.weight$"),
        ("embedding", r"^embed\."),
        ("lm_head", r"^head\."),
    )
)
#: Tensors split over GPUs (MoE expert parallelism, MTP experts included); the rest is
#: replicated. Engram tables are row lookups sharded like the experts: one alone exceeds an H200.
_SPLIT = re.compile(r"(^|\.)ffn\.experts\.|engram\.embed\.")


@dataclass
class KindSize:
    """One tensor kind: parameter count, bytes as stored, bytes as bf16, stored formats."""

    params: int = 0
    stored_bytes: int = 0
    bf16_bytes: int = 0
    split_bytes: int = 0  # the part spread over GPUs rather than replicated
    formats: list[str] = field(default_factory=list)
    #: Bytes DeepInfer holds with ``quantization="auto"`` on a backend with the FP8/FP4 kernels
    #: (the stored formats, plus what the model keeps wider: fp32 router, compressors, head).
    held_bytes: int = 0
    held_split_bytes: int = 0


@dataclass
class ModelReport:
    """Everything ``deepinfer info --model`` prints; ``to_dict`` is its ``--json`` form."""

    model: str
    model_type: str
    kinds: dict[str, KindSize]
    params: int
    params_without_mtp: int
    stored_bytes: int
    bf16_bytes: int
    held_bytes: int
    state: dict[str, Any]
    gpus: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def tensor_kind(name: str) -> str:
    """The report row of a parameter: MTP layers are one row, main layers by their role."""
    if name.startswith("mtp."):
        return "mtp"
    local = re.sub(r"^layers\.\d+\.", "", name)
    for kind, pattern in _KINDS:
        if pattern.search(local):
            return kind
    return "other"


class _StoredFormatKernels(TorchBackend):
    """The formats the ``sm100`` kernels compute on, to build the held model on ``meta``."""

    native_formats = frozenset({"fp8", "fp4_experts", "bf16_projections"})


def weight_sizes(cfg: ModelConfig, raw: dict[str, Any]) -> dict[str, KindSize]:
    """Per-kind sizes of every parameter of the model built on the meta device: as stored,
    as bf16, and as DeepInfer holds it with the stored-format kernels."""
    from deepinfer.models import hold_computed_formats, keep_stored_formats, model_class

    quant = quant_settings(raw)
    model = model_class(cfg.model_type)(cfg, dtype=torch.bfloat16, device="meta")
    kinds: dict[str, KindSize] = {}
    for name, param in model.named_parameters():
        fmt, nbytes = stored_format(name, tuple(param.shape), quant)
        size = kinds.setdefault(tensor_kind(name), KindSize())
        size.params += param.numel()
        size.stored_bytes += nbytes
        size.bf16_bytes += 2 * param.numel()
        size.split_bytes += nbytes if _SPLIT.search(name) else 0
        if fmt not in size.formats:
            size.formats.append(fmt)
    held = model_class(cfg.model_type)(
        cfg, dtype=torch.bfloat16, device="meta", backend=_StoredFormatKernels("cpu")
    )
    keep_stored_formats(held, raw, "auto")
    hold_computed_formats(held, "auto")
    for name, param in held.named_parameters():
        nbytes = param.numel() * param.element_size()
        size = kinds.setdefault(tensor_kind(name), KindSize())
        size.held_bytes += nbytes
        size.held_split_bytes += nbytes if _SPLIT.search(name) else 0
    return kinds


def fits(n: int, replicated: int, split: int, state: int, usable: int) -> bool:
    """Whether ``n`` GPUs hold the replicated weights, 1/n of the split ones and the state."""
    return n >= 1 and (replicated + state) * n + split <= usable * n


def gpus_needed(replicated: int, split: int, state: int, usable: int) -> int | None:
    """The smallest GPU count that fits, or None when replicated weights plus state never do."""
    free = usable - replicated - state
    if free <= 0:
        return None
    n = max(1, math.ceil(split / free))
    while not fits(n, replicated, split, state, usable):  # guards the ceil against rounding
        n += 1
    return n


def model_report(
    path: str | Path,
    max_model_len: int = 65536,
    num_seqs: int = 64,
    gpu_memory_gib: float = 139.0,
    gpu_memory_utilization: float = 0.9,
) -> ModelReport:
    """Build the report for the model directory (or config.json file) at ``path``.

    ``num_seqs`` sequences of ``max_model_len`` tokens are charged to every GPU: with attention
    data parallelism each GPU runs its own batch, while MoE expert parallelism splits the routed
    experts (and Engram tables) across the GPUs. MTP layers are counted as loaded.
    """
    raw = read_config(path)
    cfg = ModelConfig.from_dict(raw)
    kinds = weight_sizes(cfg, raw)
    dtype = torch.bfloat16
    fixed = state_bytes(cfg, dtype, 0)
    per_seq = state_bytes(cfg, dtype, max_model_len)
    stored = sum(k.stored_bytes for k in kinds.values())
    held = sum(k.held_bytes for k in kinds.values())
    split = sum(k.held_split_bytes for k in kinds.values())
    usable = int(gpu_memory_gib * GIB * gpu_memory_utilization)
    state_total = num_seqs * per_seq
    return ModelReport(
        model=str(path),
        model_type=cfg.model_type,
        kinds=kinds,
        params=sum(k.params for k in kinds.values()),
        params_without_mtp=sum(k.params for k in kinds.values())
        - kinds.get("mtp", KindSize()).params,
        stored_bytes=stored,
        bf16_bytes=sum(k.bf16_bytes for k in kinds.values()),
        held_bytes=held,
        state={
            "dtype": "bfloat16",
            "max_model_len": max_model_len,
            "fixed_bytes": fixed,
            "bytes_per_token": (per_seq - fixed) / max_model_len if max_model_len else 0.0,
            "bytes_per_sequence": per_seq,
        },
        gpus={
            "gpu_memory_gib": gpu_memory_gib,
            "gpu_memory_utilization": gpu_memory_utilization,
            "usable_bytes": usable,
            "num_seqs": num_seqs,
            "replicated_bytes": held - split,
            "split_bytes": split,
            "state_bytes": state_total,
            "gpus_needed": gpus_needed(held - split, split, state_total, usable),
        },
    )


def format_model_report(report: ModelReport) -> str:
    """The report as a table: one row per kind, then totals, state and GPUs (sizes in GiB)."""

    def gib(n: float) -> str:
        return f"{n / GIB:10.2f}"

    lines = [f"model: {report.model} ({report.model_type}); sizes in GiB (2**30 bytes)", ""]
    lines.append(f"{'kind':<16}{'params':>18} {'stored':>10} {'bf16':>10} {'held':>10}  stored as")
    for kind, size in report.kinds.items():
        lines.append(
            f"{kind:<16}{size.params:>18,} {gib(size.stored_bytes)} {gib(size.bf16_bytes)}"
            f" {gib(size.held_bytes)}  {', '.join(size.formats)}"
        )
    lines.append(
        f"{'total':<16}{report.params:>18,} {gib(report.stored_bytes)} {gib(report.bf16_bytes)}"
        f" {gib(report.held_bytes)}"
    )
    lines.append(f"{'without MTP':<16}{report.params_without_mtp:>18,}")
    lines.append("held: what DeepInfer holds with quantization='auto' on the sm100 kernels")
    s, g = report.state, report.gpus
    lines += [
        "",
        f"state ({s['dtype']}): {s['fixed_bytes']:,} bytes fixed + "
        f"{s['bytes_per_token']:,.1f} bytes/token; {s['bytes_per_sequence'] / GIB:.3f} GiB "
        f"per sequence at {s['max_model_len']:,} tokens",
        f"GPUs of {g['gpu_memory_gib']:g} GiB at {g['gpu_memory_utilization']:g} "
        f"({g['usable_bytes'] / GIB:.1f} GiB usable), {g['num_seqs']} sequences each: "
        f"replicated {g['replicated_bytes'] / GIB:.1f} GiB + split "
        f"{g['split_bytes'] / GIB:.1f} GiB / n + state {g['state_bytes'] / GIB:.1f} GiB",
        f"GPUs needed: {g['gpus_needed'] or 'none (replicated weights + state do not fit)'}",
    ]
    return "\n".join(lines)
