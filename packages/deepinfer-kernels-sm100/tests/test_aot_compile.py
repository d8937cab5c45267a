"""Every launched sm100 Triton kernel, compiled ahead of time for sm_100a and sm_90a on the CPU.

CI has no NVIDIA GPU: the package's other tests run the kernels in Triton's CPU interpreter, which
never lowers them through the NVIDIA backend. A construct the interpreter accepts but the
compiler rejects for Blackwell or Hopper (a dot's shape or operand types, a layout conversion,
a shared- or tensor-memory budget, a ptxas error) would first show on a GPU. Triton's compiler
takes an explicit ``GPUTarget`` and needs neither a GPU nor a driver, so here each kernel goes
through TTIR, TTGIR, LLVM IR and PTX, and with the ptxas bundled in the Triton wheel to a cubin, for
both targets, with the argument types, specialisations and constexprs its launch site passes
for DeepSeek-V4-Flash shapes (hidden 4096, 64 heads of 512, 256 experts of 2048, top-6, index
heads of 128, 4 hyper-connection streams): ``AOT_SPECS`` below, one entry per launch
configuration whose generated code differs (dtype, constexpr branch, tile shape, warps).

Gluon kernels (``@gluon.jit``, Hopper-only ones listed for sm_90a alone) go through the same
stages from Gluon's own AST source. A kernel that a launch site calls (``kernel[grid](...)``)
without an entry fails ``test_every_launched_kernel_has_an_aot_spec``; ``@triton.jit`` helpers
called only from other kernels are compiled as part of those.

The compiles run in subprocesses, one per target and in parallel. On a machine without a GPU
the root conftest sets ``TRITON_INTERPRET=1``, under which ``triton.jit`` makes interpreter
functions that cannot be compiled, and the kernel modules pick their interpreter-only code paths
(``attention.QK_NATIVE``, ``moe._WIDEN``, ``fp8_quant.EMULATE_CAST``); the subprocesses get an
environment without ``TRITON_*`` settings (tool paths aside) and a fresh cache directory, so
every run compiles the kernels as a GPU process would.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import time
import traceback
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import torch

if TYPE_CHECKING:
    from triton.runtime.jit import JITFunction

# Minutes of compiling, in the module fixture: the group keeps it on one xdist worker.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("aot_compile")]

SRC = Path(__file__).resolve().parents[1] / "src" / "deepinfer_kernels_sm100"
PACKAGE = "deepinfer_kernels_sm100"

#: CUDA compute capabilities compiled for: Triton names capability >= 90 ``sm_<cap>a``.
ARCHS: tuple[int, ...] = (100, 90)
#: Shared memory one block may opt into on H100/H200 and B200 (227 KiB): Triton refuses to
#: launch a kernel that needs more, so a kernel over it compiles but cannot run.
MAX_SHARED_BYTES = 232448
#: Tensor-memory columns of a Blackwell SM (sm_100a): Triton refuses to launch a kernel whose
#: tcgen05 accumulators need more (and compiles its body to a bare ``trap``).
MAX_TMEM_COLUMNS = 512
#: Seconds one target's worker may take (each takes about 30 s of one core).
WORKER_TIMEOUT_S = 600

#: A parameter's value at a typical launch: ``"*bf16"`` etc. for a tensor of that dtype (taken
#: as 16-byte aligned, as torch's CUDA allocations are), an int or float as the launch passes
#: it (Triton specialises ints on their value: see ``_bind``), or a constexpr's value.
Value = str | int | float | bool | None

#: (spec id, arch) -> why it does not compile to a kernel that can launch: a named
#: limitation, reported as xfail (and as a failure once it compiles, so the entry goes).
KNOWN_FAILURES: dict[tuple[str, int], str] = {}


@dataclass(frozen=True)
class AotSpec:
    """One launch configuration of a kernel: its parameters by name, as the launch site passes
    them, and the launch's ``num_warps`` (and ``num_stages``, ``maxnreg``)."""

    kernel: str  # "<module>.<kernel>" in deepinfer_kernels_sm100
    variant: str
    params: Mapping[str, Value]
    num_warps: int = 4
    #: The launch's pipeline depth (None: Triton's default), which sets the shared memory used.
    num_stages: int | None = None
    #: The launch's register cap per thread (None: ptxas's choice).
    maxnreg: int | None = None
    #: The targets whose launch sites pick this configuration (the wrapper may choose by
    #: compute capability).
    archs: tuple[int, ...] = ARCHS
    #: The launch's ``enable_fp_fusion`` (FMA contraction; off where a kernel must match
    #: another's bits).
    fp_fusion: bool = True

    @property
    def id(self) -> str:
        return f"{self.kernel}[{self.variant}]"


# -- the launch configurations -------------------------------------------------------------------
# V4-Flash: hidden 4096, 64 query heads x 512 (rope 64), 256 experts x 2048, top-6, index heads
# 64 x 128, index top-k 512, hc 4, vocab 129280; a decode batch of 32 rows. "bf16" is the model
# dtype in production, "fp32" the dtype the CPU-parity and tiny-model runs use.


def _norm_specs() -> Iterator[AotSpec]:
    k = "elementwise._rms_norm_kernel"
    # RMSNorm weights stay fp32; an unweighted norm passes the input again as the weight, and
    # a norm that does not quantise passes its output as the codes and scales.
    for dt in ("bf16", "fp32"):
        yield AotSpec(
            k,
            f"{dt}-hidden",
            {"x_ptr": f"*{dt}", "w_ptr": "*fp32", "out_ptr": f"*{dt}", "q_ptr": f"*{dt}",
             "s_ptr": f"*{dt}", "dim": 4096, "x_stride": 4096, "eps": 1e-6, "HAS_WEIGHT": True,
             "QUANT": False, "EMULATE": False, "BLOCK": 4096},
        )  # fmt: skip
    yield AotSpec(
        k,
        "bf16-query-head-unweighted",
        {"x_ptr": "*bf16", "w_ptr": "*bf16", "out_ptr": "*bf16", "q_ptr": "*bf16",
         "s_ptr": "*bf16", "dim": 512, "x_stride": 512, "eps": 1e-6, "HAS_WEIGHT": False,
         "QUANT": False, "EMULATE": False, "BLOCK": 512},
    )  # fmt: skip
    # feeding FP8 projections: the layer input (hidden) and the query latent (a row slice of
    # the fused wq_a / wkv output: 1024 of 1536 columns)
    for name, dim, stride in (("hidden", 4096, 4096), ("query-latent", 1024, 1536)):
        yield AotSpec(
            k,
            f"bf16-{name}-fp8",
            {"x_ptr": "*bf16", "w_ptr": "*fp32", "out_ptr": "*bf16", "q_ptr": "*fp8e4nv",
             "s_ptr": "*fp32", "dim": dim, "x_stride": stride, "eps": 1e-6, "HAS_WEIGHT": True,
             "QUANT": True, "EMULATE": False, "BLOCK": dim},
        )  # fmt: skip


def _rope_specs() -> Iterator[AotSpec]:
    k = "elementwise._rope_kernel"
    for dt in ("bf16", "fp32"):
        yield AotSpec(
            k,
            f"{dt}-query-heads",
            {"x_ptr": f"*{dt}", "cos_ptr": "*fp32", "sin_ptr": "*fp32", "out_ptr": f"*{dt}",
             "heads": 64, "dim": 512, "rot_start": 448, "half": 32, "sign": 1.0,
             "BLOCK_H": 16, "BLOCK_D": 512},
        )  # fmt: skip
    # kv rows and compressed entries: one head, which Triton specialises to a constant
    yield AotSpec(
        k,
        "bf16-single-head",
        {"x_ptr": "*bf16", "cos_ptr": "*fp32", "sin_ptr": "*fp32", "out_ptr": "*bf16",
         "heads": 1, "dim": 512, "rot_start": 448, "half": 32, "sign": -1.0,
         "BLOCK_H": 1, "BLOCK_D": 512},
    )  # fmt: skip


def _swiglu_specs() -> Iterator[AotSpec]:
    # the shared expert's gate and up: halves of one [rows, 2 * 2048] output (row stride 4096)
    for dt, limit, quant in (("bf16", 10.0, False), ("fp32", 0.0, False), ("bf16", 10.0, True)):
        codes = ("*fp8e4nv", "*fp32") if quant else (f"*{dt}", f"*{dt}")
        yield AotSpec(
            "elementwise._swiglu_kernel",
            f"{dt}-{'clamped' if limit > 0 else 'unclamped'}{'-fp8' if quant else ''}",
            {"gate_ptr": f"*{dt}", "up_ptr": f"*{dt}", "out_ptr": f"*{dt}", "q_ptr": codes[0],
             "s_ptr": codes[1], "width": 2048, "gate_stride": 4096, "up_stride": 4096,
             "limit": limit, "CLAMP": limit > 0, "QUANT": quant, "EMULATE": False,
             "BLOCK": 1024},
        )  # fmt: skip


def _sampling_specs() -> Iterator[AotSpec]:
    yield AotSpec(
        "sampling._uniform_kernel",
        "vocab",
        {"seed_ptr": "*i64", "pos_ptr": "*i64", "out_ptr": "*fp32", "width": 129280, "stream": 0,
         "BLOCK": 1024},
    )  # fmt: skip


def _split_linear_specs() -> Iterator[AotSpec]:
    from deepinfer_kernels_sm100 import split_linear

    # the head's bf16 parts' products at a decode batch of 32 rows, summed: two parts for
    # wide inputs, three for narrow ones
    for parts in (2, split_linear.PARTS):
        yield AotSpec(
            "split_linear._sum_parts_kernel",
            f"head_{parts}_parts",
            {"p_ptr": "*fp32", "out_ptr": "*fp32", "n": 32 * 129280, "PARTS": parts,
             "BLOCK": 2048},
        )  # fmt: skip


def _router_specs() -> Iterator[AotSpec]:
    k = "router._route_kernel"
    # without a bias (or fixed experts) the launch passes the logits (the indices) in their place
    cases = (
        ("sqrtsoftplus-biased", 256, 6, 0, True, False, True),  # V4's noaux_tc router
        ("hash-layer-fixed", 256, 6, 0, False, True, True),  # V4's tid2eid layers
        ("sigmoid-biased", 256, 8, 1, True, False, True),
        ("softmax", 64, 6, 2, False, False, False),
    )
    for variant, experts, topk, scoring, bias, fixed, norm in cases:
        yield AotSpec(
            k,
            variant,
            {"logits_ptr": "*fp32", "bias_ptr": "*fp32", "fixed_ptr": "*i64",
             "weights_ptr": "*fp32", "indices_ptr": "*i64", "experts": experts, "scaling": 1.5,
             "K": topk, "K_PAD": max(2, 1 << (topk - 1).bit_length()), "E_PAD": max(16, experts),
             "SCORING": scoring, "HAS_BIAS": bias, "FIXED": fixed, "NORM": norm},
        )  # fmt: skip


def _mhc_specs() -> Iterator[AotSpec]:
    # streams [32, 4, 4096] flattened: 16384 columns in splits of 128, (2 + 4) * 4 outputs; bf16
    # streams meet fn as bf16 parts on tensor cores, fp32 streams keep IEEE fp32 dots
    for dt, parts, block_r, warps in (("bf16", True, 128, 8), ("fp32", False, 16, 4)):
        yield AotSpec(
            "mhc._hc_mix_kernel",
            f"{dt}-hc4",
            {"x_ptr": f"*{dt}", "fn_ptr": "*fp32", "out_ptr": "*fp32", "squares_ptr": "*fp32",
             "rows": 32, "k_dim": 16384, "width": 24, "norm_eps": 1e-6,
             "SPLIT": 128, "BLOCK_R": block_r, "BLOCK_W": 32, "BLOCK_K": 64,
             "BF16_PARTS": parts, "NATIVE": True},
            num_warps=warps,
        )  # fmt: skip
    yield AotSpec(
        "mhc._hc_mix_finish_kernel",
        "hc4",
        {"part_ptr": "*fp32", "squares_ptr": "*fp32", "out_ptr": "*fp32", "rows": 32,
         "splits": 128, "k_dim": 16384, "width": 24, "norm_eps": 1e-6,
         "BLOCK_S": 128, "BLOCK_W": 32},
    )  # fmt: skip
    for dt in ("bf16", "fp32"):
        yield AotSpec(
            "mhc._mhc_post_kernel",
            f"{dt}-hc4",
            {"y_ptr": f"*{dt}", "x_ptr": f"*{dt}", "post_ptr": "*fp32", "comb_ptr": "*fp32",
             "out_ptr": f"*{dt}", "dim": 4096, "N": 4, "NP": 4, "BLOCK_D": 256},
        )  # fmt: skip
        yield AotSpec(
            "mhc._mhc_collapse_kernel",
            f"{dt}-hc4",
            {"x_ptr": f"*{dt}", "pre_ptr": "*fp32", "out_ptr": f"*{dt}", "dim": 4096,
             "N": 4, "NP": 4, "BLOCK_D": 512},
        )  # fmt: skip
        # a sublayer's entry after the mixer's splits: gates, Sinkhorn mix and (V4) collapse,
        # bare (V4.1's lagged weights), normed as the sublayer norms (V4), and quantised too;
        # V4's 4096-wide rows loaded whole on four warps, V4.1's 5120 in 512-column blocks
        for variant, collapse, norm, quant, dim in (
            ("weights", False, False, False, 4096),
            ("collapse", True, False, False, 4096),
            ("normed", True, True, False, 4096),
            ("normed-fp8", True, True, True, 4096),
            ("normed-fp8-blocks", True, True, True, 5120),
        ):
            whole = dim == 4096
            yield AotSpec(
                "mhc_fused._mhc_finish_kernel",
                f"{dt}-hc4-{variant}",
                {"part_ptr": "*fp32", "squares_ptr": "*fp32", "base_ptr": "*fp32",
                 "scale_ptr": "*fp32", "x_ptr": f"*{dt}", "pre_ptr": "*fp32",
                 "post_ptr": "*fp32", "comb_ptr": "*fp32", "out_ptr": f"*{dt}",
                 "w_ptr": "*fp32", "q_ptr": "*fp8e4nv" if quant else f"*{dt}",
                 "s_ptr": "*fp32" if quant else f"*{dt}", "rows": 32, "splits": 128,
                 "dim": dim, "iters": 20, "norm_eps": 1e-6, "hc_eps": 1e-6, "out_eps": 1e-6,
                 "N": 4, "NP": 4, "BLOCK_S": 128, "BLOCK_D": 4096 if whole else 512,
                 "COLLAPSE": collapse, "NORM": norm, "QUANT": quant, "WHOLE": whole,
                 "EXACT": whole, "EMULATE": False},
            )  # fmt: skip


def _moe_specs() -> Iterator[AotSpec]:
    # 256 experts: a program an expert (and the "none" bin, 512 bins) from 32 tokens x 6 slots
    # to the largest batch one launch groups (4096 pairs, 8 warps); a few pairs (8 tokens)
    # sorted by one program
    cases = (("decode", 192, 4, True), ("largest", 4096, 8, True),
             ("decode-few-pairs", 48, 4, False))  # fmt: skip
    for variant, pairs, warps, by_expert in cases:
        yield AotSpec(
            "moe_group._group_kernel",
            variant,
            {"idx_ptr": "*i64", "weight_ptr": "*fp32", "token_ptr": "*i32", "order_ptr": "*i32",
             "scale_ptr": "*fp32", "ends_ptr": "*i32", "experts_ptr": "*i32", "pairs": pairs,
             "k": 6, "num_experts": 256, "slots": min(256, pairs),
             "P_PAD": max(16, 1 << (pairs - 1).bit_length()), "E_PAD": 512 if by_expert else 256,
             "BY_EXPERT": by_expert},
            num_warps=warps,
        )  # fmt: skip
    # a prefill chunk's pairs past that: counted and placed in chunks of 1024, 256 experts and
    # the "none" bin in 512 bins
    yield AotSpec(
        "moe_group._chunk_counts_kernel",
        "prefill",
        {"idx_ptr": "*i64", "counts_ptr": "*i32", "pairs": 24576, "num_experts": 256,
         "CHUNK": 1024, "E_PAD": 512},
    )  # fmt: skip
    yield AotSpec(
        "moe_group._chunk_place_kernel",
        "prefill",
        {"idx_ptr": "*i64", "weight_ptr": "*fp32", "counts_ptr": "*i32", "base_ptr": "*i32",
         "token_ptr": "*i32", "order_ptr": "*i32", "scale_ptr": "*fp32", "ends_ptr": "*i32",
         "experts_ptr": "*i32", "pairs": 24576, "k": 6, "num_experts": 256, "slots": 256,
         "chunks": 24, "CHUNK": 1024, "E_PAD": 512},
    )  # fmt: skip
    # moe.TIERS and moe.LARGE (block_m, block_n, block_k, warps, stages), by the mean pairs an
    # expert has; fp32 weights (moe.FP32_TIERS, FP32_LARGE): IEEE dots; decode's few experts
    # read from the slot list (LISTED), a prefill's from the slot index; each with the shared
    # expert as the grids' last slot (SHARED: config A's bf16 and the tiny models' fp32 layers)
    from deepinfer_kernels_sm100 import moe

    tiles = [shape[:5] for shape in (*(tier for _, tier in moe.TIERS), moe.LARGE)]
    fp32_tiles = ((16, 64, 64, 4, 3), (64, 64, 64, 4, 3))
    for dt, (block_m, block_n, block_k, warps, stages), shared in [
        (dt, tile, shared)
        for dt, tile in [*(("bf16", t) for t in tiles), *(("fp32", t) for t in fp32_tiles)]
        for shared in (False, True)
    ]:
        ieee = dt == "fp32"
        variant = f"{dt}-m{block_m}-n{block_n}-k{block_k}" + ("-shared" if shared else "")
        rows = {"pairs": 192, "tokens": 32 if shared else 0, "SHARED": shared}
        yield AotSpec(
            "moe._gate_up_kernel",
            variant,
            {"x_ptr": f"*{dt}", "token_ptr": "*i32", "w_ptr": f"*{dt}", "scale_ptr": "*fp32",
             "ends_ptr": "*i32", "experts_ptr": "*i32", "h_ptr": f"*{dt}",
             "shared_ptr": f"*{dt}", **rows, "inter": 2048,
             "k_dim": 4096, "limit": 10.0, "CLAMP": True, "IEEE": ieee, "WIDEN": False,
             "LISTED": block_m < 64, "BLOCK_M": block_m, "BLOCK_N": block_n,
             "BLOCK_K": block_k},
            num_warps=warps,
            num_stages=stages,
        )  # fmt: skip
        yield AotSpec(
            "moe._down_kernel",
            variant,
            {"h_ptr": f"*{dt}", "w_ptr": f"*{dt}", "ends_ptr": "*i32", "experts_ptr": "*i32",
             "order_ptr": "*i32", "y_ptr": "*fp32", "shared_ptr": f"*{dt}", **rows,
             "d_out": 4096, "inter": 2048, "IEEE": ieee,
             "WIDEN": False, "LISTED": block_m < 64, "BLOCK_M": block_m, "BLOCK_N": block_n,
             "BLOCK_K": block_k},
            num_warps=warps,
            num_stages=stages,
        )  # fmt: skip
    # each token's six slot rows added: V4-Flash's hidden 4096 in blocks of 1024; in the
    # model the shared expert's bf16 output joins them and the sum is stored in bf16, or (a
    # shared expert run as the grids' last slot) its fp32 row after the slots'
    for variant, residual, shared, out in (
        ("top6", False, False, "fp32"),
        ("top6-residual-bf16", True, False, "bf16"),
        ("top6-shared-slot-bf16", False, True, "bf16"),
    ):
        yield AotSpec(
            "moe._slot_sum_kernel",
            variant,
            {"y_ptr": "*fp32", "idx_ptr": "*i64", "res_ptr": f"*{out}", "out_ptr": f"*{out}",
             "d_out": 4096, "K": 6, "RESIDUAL": residual, "SHARED": shared, "EMULATE": False,
             "BLOCK": 1024},
        )  # fmt: skip


def _fp4_moe_specs() -> Iterator[AotSpec]:
    # The same pairs and row tiles as _moe_specs, on packed e2m1 weights with ue8m0 bytes.
    # bf16 activations: K steps of 128 into the tensor cores, weights decoded by inline PTX,
    # 64-column tiles at decode (32 for gate/up with a handful of pairs) and 128 at prefill,
    # where 128-row tiles run on 8 warps;
    # fp32 activations: IEEE dots, K steps of one 32-wide scale group. EVEN (V4-Flash's
    # shapes) loads without masks; d = 4096 with I = 1056 (not a multiple of the tiles) takes
    # the masked loads.
    # SCALES_FIT (no scale byte above 128) folds 2**126 into the bf16 scales.
    cases = (
        ("bf16", 16, 64, 128, 2048, True, True),
        ("bf16", 16, 64, 128, 2048, True, False),
        ("bf16", 16, 32, 128, 2048, True, True),
        ("bf16", 128, 128, 128, 2048, True, True),
        ("bf16", 16, 64, 128, 1056, False, False),
        ("fp32", 16, 64, 32, 2048, True, False),
    )
    for dt, block_m, block_n, block_k, inter, even, fit in cases:
        variant = f"{dt}-block-m{block_m}-n{block_n}-k{block_k}-i{inter}" + ("-fit" * fit)
        flags = {"IEEE": dt == "fp32", "WIDEN": False, "EVEN": even, "SCALES_FIT": fit,
                 "LISTED": block_m == 16, "BLOCK_M": block_m, "BLOCK_N": block_n,
                 "BLOCK_K": block_k}  # fmt: skip
        yield AotSpec(
            "fp4_moe._fp4_gate_up_kernel",
            variant,
            {"x_ptr": f"*{dt}", "token_ptr": "*i32", "w_ptr": "*u8", "ws_ptr": "*u8",
             "scale_ptr": "*fp32", "ends_ptr": "*i32", "experts_ptr": "*i32", "h_ptr": f"*{dt}",
             "inter": inter, "k_dim": 4096, "limit": 10.0, "CLAMP": True, **flags},
            num_warps=8 if block_m == 128 else 4,
        )  # fmt: skip
        yield AotSpec(
            "fp4_moe._fp4_down_kernel",
            variant,
            {"h_ptr": f"*{dt}", "w_ptr": "*u8", "ws_ptr": "*u8", "ends_ptr": "*i32",
             "experts_ptr": "*i32", "order_ptr": "*i32", "y_ptr": "*fp32", "d_out": 4096,
             "inter": inter, **flags},
            num_warps=8 if block_m == 128 else 4,
        )  # fmt: skip


def _fp4_gluon_specs() -> Iterator[AotSpec]:
    # Hopper's decode-size FP4 expert kernels (Gluon, mma.sync with hand-placed registers:
    # sm_90a only), in the launch shapes fp4_gluon.pick_tiles takes at V4-Flash's sizes for
    # batches of 1 (6 pairs, a slot each, ungrouped: gate/up splits K), 8, 256 (slots of 9 to
    # 16 pairs take two token tiles) and 512 (3072 pairs on a slot per expert: two token tiles
    # a pass); the hidden activation in pair order.
    from deepinfer_kernels_sm100 import fp4_gluon

    for batch in (1, 8, 256, 512):
        pairs = 6 * batch
        slots = min(256, pairs)
        mode = fp4_gluon.BY_PAIR if batch == 1 else fp4_gluon.LISTED if slots < 256 else 0
        up = fp4_gluon.pick_tiles(4096, 2048, pairs, slots, 2, 132)
        down = fp4_gluon.pick_tiles(2048, 4096, pairs, slots, 1, 132)
        for kernel, tiles in (("gate_up", up), ("down", down)):
            flags = {"SLOTS": mode, "PAIRED": True, "WARPS_N": tiles.warps_n,
                     "SPLIT_K": tiles.split_k, "N_TILES": tiles.n_tiles, "STAGES": tiles.stages,
                     "WIDE": fp4_gluon._flags(tiles, pairs, slots)["WIDE"]}  # fmt: skip
            rows = order = None if batch == 1 else "*i32"
            if kernel == "gate_up":
                params = {"x_ptr": "*bf16", "token_ptr": rows, "w_ptr": "*u8", "ws_ptr": "*u8",
                          "scale_ptr": "*fp32", "ends_ptr": "*i32", "experts_ptr": "*i32",
                          "h_ptr": "*bf16", "inter": 2048, "k_dim": 4096, "limit": 10.0,
                          "CLAMP": True, "PER_ROW": 6, **flags}  # fmt: skip
            else:
                params = {"h_ptr": "*bf16", "w_ptr": "*u8", "ws_ptr": "*u8", "ends_ptr": "*i32",
                          "experts_ptr": "*i32", "order_ptr": order, "y_ptr": "*fp32",
                          "d_out": 4096, "inter": 2048, "PDL": fp4_gluon.PDL_DOWN and batch == 1,
                          **flags}  # fmt: skip
            yield AotSpec(
                f"fp4_gluon._fp4_{kernel}_gluon",
                f"decode{batch}-w{tiles.warps_n}-k{tiles.split_k}-n{tiles.n_tiles}-s{tiles.stages}",
                params,
                num_warps=tiles.warps_n * tiles.split_k,
                maxnreg=tiles.maxnreg,
                archs=(90,),
            )
    yield from _fp4_gluon_sum_specs()


def _fp4_gluon_sum_specs() -> Iterator[AotSpec]:
    # The down projection adding each token's 6 pairs (fp4_gluon_sum), as pick_tiles takes it
    # at V4-Flash's sizes for one and two tokens: PDL launches with a bf16 residual and output,
    # and a plain one to fp32.
    from deepinfer_kernels_sm100 import fp4_gluon_sum

    for tokens, pdl, res, out in ((1, True, "*bf16", "*bf16"), (1, False, None, "*fp32"),
                                  (2, True, "*bf16", "*bf16")):  # fmt: skip
        tiles = fp4_gluon_sum.pick_tiles(2048, 4096, 6, tokens, 132)
        params = {"h_ptr": "*bf16", "w_ptr": "*u8", "ws_ptr": "*u8", "idx_ptr": "*i64",
                  "res_ptr": res, "out_ptr": out, "d_out": 4096, "inter": 2048, "TOPK": 6,
                  "PER": 2048 // (128 * tiles.split_k), "PAIRED": True,
                  "WARPS_N": tiles.warps_n, "SPLIT_K": tiles.split_k, "STAGES": tiles.stages,
                  "PDL": pdl}  # fmt: skip
        yield AotSpec(
            "fp4_gluon_sum._fp4_down_sum_gluon",
            f"decode{tokens}-k{tiles.split_k}-s{tiles.stages}-{'pdl' if pdl else 'plain'}",
            params,
            num_warps=tiles.warps_n * tiles.split_k,
            archs=(90,),
        )


def _fp8_gluon_specs() -> Iterator[AotSpec]:
    # Hopper's decode-size FP8 linear (Gluon, mma.sync on e4m3 registers: sm_90a only), in the
    # launch shapes fp8_gluon.pick_tiles takes at V4-Flash's projections, one, two and four
    # token tiles a pass, ue8m0 and fp32 scales, the grouped wo_a, V4.1's 32 x 32 blocks
    # (8-byte loads, a scale per MMA), K split across programs (a forced launch shape), and
    # registers capped.
    from deepinfer_kernels_sm100 import fp8_gluon

    cases = (  # (variant, rows, N, K, groups, ue8m0, weight block, out)
        ("decode1-wq_a-ue8m0", 1, 1024, 4096, 1, True, 128, "bf16"),
        ("decode1-wkv-ue8m0", 1, 512, 4096, 1, True, 128, "bf16"),
        ("decode1-wq_b-fp32-scales", 1, 32768, 1024, 1, False, 128, "bf16"),
        ("decode8-wo_b-ue8m0", 8, 4096, 8192, 1, True, 128, "bf16"),
        ("decode16-shared_w13-ue8m0", 16, 4096, 4096, 1, True, 128, "bf16"),
        ("decode64-shared_w2-fp32-out", 64, 4096, 2048, 1, True, 128, "fp32"),
        ("decode1-wo_a-grouped", 1, 8192, 4096, 8, True, 128, "bf16"),
        ("decode8-v41-block32", 8, 5120, 5120, 1, True, 32, "bf16"),
        ("decode5-wkv-split-programs", 5, 512, 4096, 1, True, 128, "bf16"),
        ("decode1-wq_b-registers-capped", 1, 32768, 1024, 1, True, 128, "bf16"),
    )
    for variant, m, n, k, groups, ue8m0, wb, out in cases:
        tiles = fp8_gluon.pick_tiles(n, k, 132)  # an H100/H200's SMs
        if "split-programs" in variant:
            tiles = fp8_gluon.Tiles(1, 4, 2, 2)
        if "capped" in variant:  # (fp8_regs_ab.py's cap)
            tiles = tiles._replace(maxnreg=168)
        yield AotSpec(
            "fp8_gluon._fp8_decode_gluon",
            f"{variant}-w{tiles.warps_n}-k{tiles.split_k}-p{tiles.splits}-s{tiles.stages}",
            {"a_ptr": "*fp8e4nv", "as_ptr": "*fp32", "w_ptr": "*fp8e4nv",
             "ws_ptr": "*u8" if ue8m0 else "*fp32", "out_ptr": f"*{out}", "part_ptr":
             "*fp32" if tiles.splits > 1 else f"*{out}", "count_ptr": "*i32", "m": m, "n": n,
             "k_dim": k, "lda": groups * k, "group_n": n // groups, "SCALE_UE8M0": ue8m0,
             "W_BN": wb, "W_BK": wb, "WARPS_N": tiles.warps_n, "SPLIT_K": tiles.split_k,
             "SPLITS": tiles.splits, "N_TILES": fp8_gluon.n_tiles(m), "STAGES": tiles.stages,
             "PDL": fp8_gluon.PDL and n * k <= fp8_gluon.PDL_MAX_BYTES},
            num_warps=tiles.warps_n * tiles.split_k,
            maxnreg=tiles.maxnreg,
            archs=(90,),
        )  # fmt: skip


def _indexer_specs() -> Iterator[AotSpec]:
    # 16-bit queries and keys meet in tensor-core dots as they are; fp32 ones in IEEE dots.
    # Pages hold 128 / ratio entries: 32 for V4's ratio-4 layers, 128 for V4.1's ratio-1.
    for dt, page_rows in (("bf16", 32), ("bf16", 128), ("fp32", 32)):
        native = dt == "bf16"
        yield AotSpec(
            "indexer._paged_scores_kernel",
            f"{dt}-page-rows{page_rows}",
            {"q_ptr": f"*{dt}", "w_ptr": f"*{dt}", "pages_ptr": f"*{dt}", "index_ptr": "*i64",
             "count_ptr": "*i64", "out_ptr": "*fp32", "seq": 1, "heads": 64, "limit": 8192,
             "index_cols": 8192 // page_rows, "dim": 128, "w_scale": 0.0110485,
             "PAGE_ROWS": page_rows,
             "NATIVE": native, "PRECISION": "tf32" if native else "ieee",
             "BLOCK_H": 32, "BLOCK_T": 128, "BLOCK_C": 128},
            num_warps=8,
        )  # fmt: skip
    for dt, visible in (("bf16", True), ("fp32", False)):
        native = dt == "bf16"
        yield AotSpec(
            "indexer._dense_scores_kernel",
            f"{dt}-{'visible' if visible else 'all'}",
            {"q_ptr": f"*{dt}", "w_ptr": f"*{dt}", "k_ptr": f"*{dt}", "seen_ptr": "*i64",
             "out_ptr": "*fp32", "seq": 4096, "heads": 64, "limit": 1024, "dim": 128,
             "q_sb": 4096 * 64 * 128, "q_ss": 64 * 128, "q_sh": 128, "k_sb": 1024 * 128,
             "k_st": 128, "w_scale": 0.0110485, "VISIBLE": visible, "NATIVE": native,
             "PRECISION": "tf32" if native else "ieee", "BLOCK_S": 64, "BLOCK_T": 64,
             "BLOCK_C": 128},
            num_warps=4,
        )  # fmt: skip


#: which entries a top-k row may see (topk.ALL / PREFIX / MASK), and the pointers the launch
#: passes for them: n_visible int64 (PREFIX), allowed bool (MASK), else the scores again
_TOPK_MODES: dict[str, tuple[int, str, str]] = {
    "all": (0, "*fp32", "*fp32"),
    "prefix": (1, "*i64", "*fp32"),
    "mask": (2, "*fp32", "*u1"),
}


def _topk_specs() -> Iterator[AotSpec]:
    # 32 decode rows x 32768 entries, k = 512: 16 segments of 2048 entries per row
    common = {"entries": 32768, "k": 512, "segment": 2048, "score_stride": 32768}
    for mode, passes in (("prefix", (0, 1, 2, 3)), ("mask", (0, 3)), ("all", (0,))):
        code, n_vis, allowed = _TOPK_MODES[mode]
        for p in passes:
            yield AotSpec(
                "topk._histogram_kernel",
                f"{mode}-pass{p}",
                {"score_ptr": "*fp32", "n_vis_ptr": n_vis, "allowed_ptr": allowed,
                 "hist_ptr": "*i32", **common, "PASS": p, "MODE": code, "BLOCK": 1024},
                num_warps=8,
            )  # fmt: skip
    for mode in ("prefix", "mask"):
        code, n_vis, allowed = _TOPK_MODES[mode]
        for write in (False, True):
            yield AotSpec(
                "topk._collect_kernel",
                f"{mode}-{'write' if write else 'count'}",
                {"score_ptr": "*fp32", "n_vis_ptr": n_vis, "allowed_ptr": allowed,
                 "hist_ptr": "*i32", "count_ptr": "*i32", "scratch_ptr": "*i64", **common,
                 "WRITE": write, "MODE": code, "K_PAD": 512, "SEGMENTS_PAD": 16, "BLOCK": 1024},
                num_warps=8,
            )  # fmt: skip
    # the index top-k (512), and the largest k the register sort takes (topk.MAX_K)
    for mode, k_pad in (("prefix", 512), ("mask", 512), ("prefix", 4096)):
        code, n_vis, allowed = _TOPK_MODES[mode]
        yield AotSpec(
            "topk._sort_kernel",
            f"{mode}-k{k_pad}",
            {"n_vis_ptr": n_vis, "allowed_ptr": allowed, "scratch_ptr": "*i64", "out_ptr": "*i64",
             "entries": 32768, "k": k_pad, "MODE": code, "K_PAD": k_pad},
        )  # fmt: skip
    # a prefill chunk's rows selected from in registers: the longest (topk.ROW_SELECT_MAX, a
    # 16k-token chunk's entries at ratio 4), causal or with a mask, and a shorter causal one
    for mode, t_pad in (("prefix", 4096), ("mask", 4096), ("prefix", 2048)):
        code, n_vis, allowed = _TOPK_MODES[mode]
        yield AotSpec(
            "topk._row_select_kernel",
            f"{mode}-t{t_pad}",
            {"score_ptr": "*fp32", "n_vis_ptr": n_vis, "allowed_ptr": allowed,
             "scratch_ptr": "*i64", "entries": t_pad, "k": 512, "score_stride": t_pad,
             "MODE": code, "T_PAD": t_pad, "K_PAD": 512},
            num_warps=8,
        )  # fmt: skip
    # rows sorted whole: a short decode row, and the longest (topk.ROW_SORT_MAX) with a mask
    for mode, t_pad, warps in (("prefix", 128, 4), ("all", 2048, 8), ("mask", 2048, 8)):
        code, n_vis, allowed = _TOPK_MODES[mode]
        yield AotSpec(
            "topk._row_sort_kernel",
            f"{mode}-t{t_pad}",
            {"score_ptr": "*fp32", "n_vis_ptr": n_vis, "allowed_ptr": allowed,
             "out_ptr": "*i64", "entries": t_pad, "k": min(512, t_pad), "score_stride": t_pad,
             "MODE": code, "T_PAD": t_pad},
            num_warps=warps,
        )  # fmt: skip


def _attention_specs() -> Iterator[AotSpec]:
    from deepinfer_kernels_sm100 import attention

    k = "attention._mqa_sink_kernel"
    # (variant, dtype, mode, split, heads, dim, BLOCK_H, BLOCK_DK, BLOCK_DV, warps), as
    # attention._launch picks them: a decode batch of 8 rows cuts its keys into ranges
    # (flash-decoding) over programs of 128 output columns; from 32 (row, head block) pairs on
    # a program takes 256 columns (WIDE_BLOCK_DV), and 32 rows still split their keys in two;
    # a prefill chunk of 512 queries gives programs enough unsplit. A wide program of 16 heads
    # (config A) takes all 512 columns (WIDE_CELLS). On Blackwell bf16 values
    # keep 128 columns even then (attention.wide_block_dv: tensor memory). The embedded "tiny"
    # model (4 heads of 32) pads its heads to 16-row dots on 4 warps. Modes: 0 dense (a mask),
    # 1 sparse (key rows), 2 paged (decode: a ring and entry pages read in place, 16-head
    # programs on PAGED_WARPS; "mixed": fp32 entry pages beside a bf16 ring, two loads, POOLS 2).
    hopper, blackwell = (90,), (100,)
    cases = (
        ("bf16-decode8-dense-split", "bf16", 0, True, 64, 512, 64, 64, 128, 8, ARCHS),
        ("bf16-decode32-dense-wide-split", "bf16", 0, True, 64, 512, 64, 64, 256, 8, hopper),
        ("bf16-decode32-dense-wide-split-tmem", "bf16", 0, True, 64, 512, 64, 64, 128, 8,
         blackwell),
        ("bf16-decode8-sparse-split", "bf16", 1, True, 64, 512, 64, 64, 128, 8, ARCHS),
        ("bf16-prefill-sparse-wide", "bf16", 1, False, 64, 512, 64, 64, 256, 8, hopper),
        ("bf16-prefill-sparse-wide-tmem", "bf16", 1, False, 64, 512, 64, 64, 128, 8,
         blackwell),
        ("bf16-prefill-sparse-16heads-wide", "bf16", 1, False, 16, 512, 16, 64, 512, 4, hopper),
        ("bf16-prefill-sparse-16heads-wide-tmem", "bf16", 1, False, 16, 512, 16, 64, 128, 4,
         blackwell),
        ("bf16-decode8-paged-split", "bf16", 2, True, 64, 512, 64, 64, 128, 8, ARCHS),
        ("bf16-decode256-paged-wide", "bf16", 2, False, 64, 512, 64, 64, 256, 8, hopper),
        ("bf16-decode256-paged-wide-tmem", "bf16", 2, False, 64, 512, 64, 64, 128, 8,
         blackwell),
        ("bf16-decode256-paged-16heads-wide", "bf16", 2, False, 16, 512, 16, 64, 512, 8, hopper),
        ("bf16-decode256-paged-16heads-wide-tmem", "bf16", 2, False, 16, 512, 16, 64, 128, 8,
         blackwell),
        ("bf16-decode8-paged-split-mixed", "bf16", 2, True, 64, 512, 64, 64, 128, 8, ARCHS),
        ("fp32-decode8-dense-split", "fp32", 0, True, 64, 512, 64, 64, 128, 8, ARCHS),
        ("fp32-decode8-paged-split", "fp32", 2, True, 64, 512, 64, 64, 128, 8, ARCHS),
        ("fp32-prefill-sparse-wide", "fp32", 1, False, 64, 512, 64, 64, 256, 8, ARCHS),
        ("bf16-tiny-dense", "bf16", 0, False, 4, 32, 16, 32, 32, 4, ARCHS),
        ("bf16-tiny-paged", "bf16", 2, False, 4, 32, 16, 32, 32, 4, ARCHS),
        ("fp32-tiny-dense", "fp32", 0, False, 4, 32, 16, 32, 32, 4, ARCHS),
    )  # fmt: skip
    for variant, dt, mode, split, heads, dim, block_h, block_dk, block_dv, warps, archs in cases:
        native = dt == "bf16"
        # unsplit launches pass the output again for the partial results
        part = "*fp32" if split else f"*{dt}"
        select = ("*u8", "*i64", "*i64")[mode]
        pools = 0 if mode != 2 else 2 if variant.endswith("mixed") else 1
        kv2 = "*fp32" if pools == 2 else f"*{dt}"
        # paged: pool b (entry pages) and its entries, both pools' page lists (the ring's: the
        # rows' slots); otherwise the launch repeats kv and select for them
        paged = (
            {"kv2_ptr": kv2, "select2_ptr": "*i64", "pages_ptr": "*i64", "pages2_ptr": "*i64",
             "keys_a": 128, "n_pages": 1, "n_pages2": 16, "per_page": 128, "per_page2": 32}
            if mode == 2 else
            {"kv2_ptr": f"*{dt}", "select2_ptr": select, "pages_ptr": select,
             "pages2_ptr": select, "keys_a": 0, "n_pages": 0, "n_pages2": 0, "per_page": 1,
             "per_page2": 1}
        )  # fmt: skip
        # decode rows (paged, unsplit) rotate their output back where they write it
        derotate = mode == 2 and not split
        yield AotSpec(
            k,
            variant,
            {"q_ptr": f"*{dt}", "kv_ptr": f"*{dt}", "select_ptr": select,
             "sink_ptr": "*fp32", "out_ptr": f"*{dt}", "part_ptr": part, "stat_ptr": part,
             "seq": 1, "heads": heads, "keys": 512 if mode == 1 else 640,
             "kv_rows": 0 if mode == 2 else 640, "dim": dim, "scale": dim**-0.5,
             "split_keys": 192 if split else 640, "splits": 4 if split else 1, **paged,
             "cos_ptr": "*fp32", "sin_ptr": "*fp32", "rot_start": dim - min(64, dim // 2),
             "half": min(32, dim // 4), "MODE": mode, "POOLS": pools, "SPLIT": split,
             "DEROTATE": derotate, "QK_NATIVE": native,
             "QK_PRECISION": "tf32" if native else "ieee",
             "PV_PARTS": attention.PV_PARTS if native else 0,
             "BLOCK_H": block_h, "BLOCK_L": 64, "BLOCK_DK": block_dk, "BLOCK_DV": block_dv},
            num_warps=warps,
            archs=archs,
        )  # fmt: skip
    yield from _decode_t_specs()
    yield from _block_attention_specs()
    for dt in ("bf16", "fp32"):
        for derotate in (False, True):
            yield AotSpec(
                "attention_combine._combine_kernel",
                f"{dt}{'-derotate' if derotate else ''}",
                {"part_ptr": "*fp32", "stat_ptr": "*fp32", "sink_ptr": "*fp32",
                 "out_ptr": f"*{dt}", "cos_ptr": "*fp32", "sin_ptr": "*fp32", "heads": 64,
                 "dim": 512, "splits": 4, "rot_start": 448, "half": 32, "DEROTATE": derotate,
                 "BLOCK_H": 64, "BLOCK_DV": 128},
            )  # fmt: skip


def _block_attention_specs() -> Iterator[AotSpec]:
    """attention_blocks' union and attention kernels as block_sparse_attention launches them
    for a config A prefill chunk (16 heads of 512: blocks of 4 queries over a ratio-4 layer's
    640 keys a query), bf16 on the GPU and fp32 as the CPU-parity runs hold it; Blackwell's
    bf16 programs keep 128 columns (attention.wide_block_dv)."""
    from deepinfer_kernels_sm100 import attention
    from deepinfer_kernels_sm100 import attention_blocks as ab

    queries = ab.queries_per_block(16)
    yield AotSpec(
        "attention_blocks._block_codes_kernel",
        "a-ratio4",
        {"index_ptr": "*i64", "codes_ptr": "*i32", "seq": 4096, "blocks": 1024, "keys": 640,
         "width": queries * 640, "QUERIES": queries, "BLOCK": ab.CODES_BLOCK},
    )  # fmt: skip
    yield AotSpec(
        "attention_blocks._block_keys_kernel",
        "a-ratio4",
        {"codes_ptr": "*i32", "rows_ptr": "*i32", "bits_ptr": "*i32", "count_ptr": "*i32",
         "width": queries * 640, "QUERIES": queries,
         "WIDTH_POW2": 1 << (queries * 640 - 1).bit_length()},
        num_warps=ab.KEYS_WARPS,
    )  # fmt: skip
    # attention.wide_block_dv for 64 rows: 256 columns, 128 for bf16 values on Blackwell
    for dt, block_dv, archs in (
        ("bf16", attention.WIDE_BLOCK_DV, (90,)),
        ("bf16", attention.BLOCK_DV, (100,)),
        ("fp32", attention.WIDE_BLOCK_DV, ARCHS),
    ):
        native = dt == "bf16"
        yield AotSpec(
            "attention_blocks._block_attention_kernel",
            f"{dt}-a-dv{block_dv}",
            {"q_ptr": f"*{dt}", "kv_ptr": f"*{dt}", "rows_ptr": "*i32", "bits_ptr": "*i32",
             "count_ptr": "*i32", "sink_ptr": "*fp32", "out_ptr": f"*{dt}", "seq": 4096,
             "blocks": 1024, "width": queries * 640, "heads": 16, "kv_rows": 5120, "dim": 512,
             "scale": 512**-0.5, "QK_NATIVE": native, "QK_PRECISION": "tf32" if native else "ieee",
             "PV_PARTS": attention.PV_PARTS if native else 0, "QUERIES": queries,
             "HEADS": ab.ROWS // queries, "BLOCK_L": ab.BLOCK_L, "BLOCK_DK": ab.BLOCK_DK,
             "BLOCK_DV": block_dv},
            num_warps=ab.NUM_WARPS,
            archs=archs,
        )  # fmt: skip


def _decode_t_specs() -> Iterator[AotSpec]:
    """attention_decode's transposed decode kernel, as paged_mqa_sink_attention launches it for
    bf16 rows of up to 16 heads: config A's decode rows (16 heads of 512; unsplit with the
    rope channels turned back, and split in key ranges) and the embedded model's (4 heads of
    32)."""
    from deepinfer_kernels_sm100 import attention
    from deepinfer_kernels_sm100 import attention_decode as ad

    cases = (("a-unsplit", 16, 512, False), ("a-split", 16, 512, True), ("tiny", 4, 32, False))
    for variant, heads, dim, split in cases:
        yield AotSpec(
            "attention_decode._decode_t_kernel",
            variant,
            {"q_ptr": "*bf16", "kv_ptr": "*bf16", "kv2_ptr": "*bf16",
             "select_ptr": "*i64", "select2_ptr": "*i64", "pages_ptr": "*i64",
             "pages2_ptr": "*i64", "sink_ptr": "*fp32", "out_ptr": "*bf16",
             "part_ptr": "*fp32" if split else "*bf16", "stat_ptr": "*fp32" if split else "*bf16",
             "cos_ptr": "*fp32", "sin_ptr": "*fp32", "heads": heads, "keys": 256, "dim": dim,
             "scale": dim**-0.5, "split_keys": 64 if split else 256, "splits": 4 if split else 1,
             "keys_a": 128, "n_pages": 1, "n_pages2": 2, "per_page": 128, "per_page2": 64,
             "rot_start": dim - min(64, dim // 2), "half": min(32, dim // 4), "POOLS": 1,
             "SPLIT": split, "DEROTATE": not split, "NATIVE": True, "PV_PARTS": attention.PV_PARTS,
             "BLOCK_H": 16, "BLOCK_L": ad.BLOCK_L, "BLOCK_D": dim},
            num_warps=ad.NUM_WARPS,
            num_stages=ad.NUM_STAGES,
            maxnreg=ad.MAXNREG,
        )  # fmt: skip


def _norm_rope_specs() -> Iterator[AotSpec]:
    k = "norm_rope._norm_rope_kernel"
    # query heads (unweighted), the kv row (a row slice of the fused wq_a / wkv output), a
    # compressed entry (weighted, one head) and a decode step's entries stored at their pages'
    # rows (OUT_ROWS)
    for dt in ("bf16", "fp32"):
        for variant, heads, stride, weighted, block_h, into in (
            ("query-heads", 64, 64 * 512, False, 16, False),
            ("kv-row", 1, 1536, True, 1, False),
            ("entry", 1, 512, True, 1, False),
            ("entry-into-pages", 1, 512, True, 1, True),
        ):
            yield AotSpec(
                k,
                f"{dt}-{variant}",
                {"x_ptr": f"*{dt}", "w_ptr": "*fp32", "cos_ptr": "*fp32", "sin_ptr": "*fp32",
                 "out_ptr": f"*{dt}", "dest_ptr": "*i64" if into else f"*{dt}", "heads": heads,
                 "dim": 512, "rot_start": 448, "half": 32, "x_stride": stride, "eps": 1e-6,
                 "HAS_WEIGHT": weighted, "OUT_ROWS": into, "EMULATE": False,
                 "BLOCK_H": block_h, "BLOCK_D": 512},
            )  # fmt: skip


def _compress_specs() -> Iterator[AotSpec]:
    # kv/score [B, n, r, c * 512] fp32: ratio 4 overlaps windows (c = 2), ratio 128 does not
    cases = (
        ("ratio4-overlap-carried", 4, 1024, True, True, 16, 128),
        ("ratio4-overlap-first", 4, 1024, True, False, 16, 128),
        ("ratio128", 128, 512, False, False, 128, 32),
    )
    for variant, r, width, overlap, prev, block_r, block_d in cases:
        yield AotSpec(
            "compress._softmax_pool_kernel",
            variant,
            {"kv_ptr": "*fp32", "score_ptr": "*fp32", "prev_kv_ptr": "*fp32",
             "prev_score_ptr": "*fp32", "out_ptr": "*bf16", "n": 1, "r": r, "dim": 512,
             "stride_b": r * width, "stride_n": r * width, "stride_r": width,
             "OVERLAP": overlap, "HAS_PREV": prev, "BLOCK_R": block_r, "BLOCK_D": block_d,
             "EMULATE": False},
            fp_fusion=False,
        )  # fmt: skip
    # a decode step's windows over the slot buffers: the CSA kinds with and without rollback
    # history, reading a fused wkv/wgate output in place, the HCA kind (int64 slots, phases and
    # ring rows); V4's compressors add a position bias, V4.1's shared ones none
    for variant, r, overlap, history, block_r, block_d in (
        ("slots-ratio4-overlap", 4, True, False, 16, 128),
        ("slots-ratio4-overlap-history", 4, True, True, 16, 128),
        ("slots-ratio128", 128, False, False, 128, 32),
    ):
        yield AotSpec(
            "compress._slot_pool_kernel",
            variant,
            {"kv_ptr": "*fp32", "score_ptr": "*fp32", "bias_ptr": "*fp32", "kv_buf_ptr": "*fp32",
             "score_buf_ptr": "*fp32", "prev_kv_ptr": "*fp32", "prev_score_ptr": "*fp32",
             "hist_kv_ptr": "*fp32", "hist_score_ptr": "*fp32", "slots_ptr": "*i64",
             "phase_ptr": "*i64", "hist_row_ptr": "*i64", "out_ptr": "*bf16", "r": r,
             "dim": 512, "keep": 14 if history else 1, "stride_in": 4 * 512 if overlap else 512,
             "stride_slot": 2,
             "OVERLAP": overlap, "HISTORY": history, "HAS_BIAS": overlap, "EMULATE": False,
             "BLOCK_R": block_r, "BLOCK_D": block_d},
            fp_fusion=False,
        )  # fmt: skip


def _compress_verify_specs() -> Iterator[AotSpec]:
    # a verification pass's windows (T = 6: the last token and 5 drafts) over the slot
    # buffers with rollback history, reading a fused wkv/wgate output in place: V4's CSA and
    # HCA kinds (position bias) and V4.1's shared ratio-2 pairs (none)
    for variant, r, overlap, bias, windows, block_r, block_d in (
        ("ratio4-overlap", 4, True, True, 2, 16, 128),
        ("ratio128", 128, False, True, 1, 128, 32),
        ("ratio2-shared", 2, False, False, 3, 16, 128),
    ):
        width = 2 * 512 if overlap else 512
        yield AotSpec(
            "compress_verify._verify_pool_kernel",
            variant,
            {"kv_ptr": "*fp32", "score_ptr": "*fp32", "bias_ptr": "*fp32", "kv_buf_ptr": "*fp32",
             "score_buf_ptr": "*fp32", "prev_kv_ptr": "*fp32", "prev_score_ptr": "*fp32",
             "hist_kv_ptr": "*fp32", "hist_score_ptr": "*fp32", "slots_ptr": "*i64",
             "positions_ptr": "*i64", "lengths_ptr": "*i64", "out_ptr": "*bf16", "r": r,
             "dim": 512, "keep": 5 + 2 * r, "t_len": 6, "stride_b": 6 * 2 * width,
             "stride_t": 2 * width, "stride_slot": 1, "stride_pos": 6, "stride_pos_t": 1,
             "NUM_WINDOWS": windows, "OVERLAP": overlap, "HISTORY": True, "HAS_BIAS": bias,
             "EMULATE": False, "BLOCK_R": block_r, "BLOCK_D": block_d, "BLOCK_T": 16},
            fp_fusion=False,
        )  # fmt: skip


def _verify_plan_specs() -> Iterator[AotSpec]:
    # a verification pass of k = 5 drafts (6 tokens a row) at V4-Flash's ratios 4 and 128
    for r in (4, 128):
        w = -(-6 // r)
        yield AotSpec(
            "verify_plan._verify_plan_kernel",
            f"ratio_{r}",
            {"pos_ptr": "*i64", "slot_ptr": "*i64", "len_ptr": "*i64", "phase_ptr": "*i64",
             "closes_ptr": "*i1", "entry_ptr": "*i64", "source_ptr": "*i64",
             "position_ptr": "*i64", "open_ptr": "*i64", "count_ptr": "*i64", "t": 6, "w": w,
             "R": r, "BLOCK_T": 8, "BLOCK_W": 2 if w == 2 else 1},
        )  # fmt: skip


def _fp8_linear_specs() -> Iterator[AotSpec]:
    # activations quantised once ahead of a prefill GEMM: bf16 model activations, fp32 runs
    for dt in ("bf16", "fp32"):
        yield AotSpec(
            "fp8_quant._quant_act_kernel",
            dt,
            {"x_ptr": f"*{dt}", "q_ptr": "*fp8e4nv", "s_ptr": "*fp32", "m": 4096, "k": 4096,
             "EMULATE": False, "GROUP": 128, "BLOCK_R": 16},
        )  # fmt: skip
    # (variant, rows, N, K, ue8m0 scales, weight block, BLOCK_M, BLOCK_N, BLOCK_K, warps, out,
    # fused): as fp8_linear._tiles picks them. Up to 64 rows take decode tiles over a split K
    # (activations quantised ahead, or in the GEMM with FUSE_DECODE_QUANT unless the weight
    # blocks are narrower than a group, V4.1's 32 x 32); V4-Flash's q/kv/o projections (wq_a
    # 1024 x 4096, wkv 512 x 4096, wq_b 32768 x 1024, wo_b 4096 x 8192); ue8m0 scales in the
    # instruct checkpoints, fp32 in -Base.
    cases = (
        ("decode1-wq_a-ue8m0", 1, 1024, 4096, True, 128, 16, 64, 128, 4, "bf16", False),
        ("decode1-wq_a-ue8m0-fused", 1, 1024, 4096, True, 128, 16, 64, 128, 4, "bf16", True),
        ("decode32-wkv-ue8m0", 32, 512, 4096, True, 128, 32, 64, 128, 4, "bf16", False),
        ("decode64-wo_b-ue8m0", 64, 4096, 8192, True, 128, 64, 64, 128, 4, "bf16", False),
        ("decode16-4096-fp32-scales", 16, 4096, 4096, False, 128, 16, 64, 128, 4, "bf16", False),
        ("decode16-v41-block32", 16, 5120, 5120, True, 32, 16, 64, 32, 4, "bf16", False),
    )
    for variant, m, n, k, ue8m0, wb, block_m, block_n, block_k, warps, out, fused in cases:
        split = m <= 64  # decode tiles split K: fp32 partial sums (REDUCE: by the last program)
        yield AotSpec(
            "fp8_linear._fp8_gemm_kernel",
            variant,
            {"a_ptr": "*bf16" if fused else "*fp8e4nv", "as_ptr": "*fp8e4nv" if fused else "*fp32",
             "w_ptr": "*fp8e4nv", "ws_ptr": "*u8" if ue8m0 else "*fp32",
             "out_ptr": f"*{out}", "part_ptr": "*fp32" if split else f"*{out}",
             "count_ptr": "*i32", "m": m, "n": n, "k": k, "lda": k, "group_n": n,
             "k_split": 512 if split else k, "splits": k // 512 if split else 1,
             "FUSED": fused, "EMULATE": False, "SCALE_UE8M0": ue8m0, "SPLIT": split,
             "REDUCE": split and block_m <= 16,
             "GROUP": 128, "W_BN": wb, "W_BK": wb,
             "BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": block_k},
            num_warps=warps,
        )  # fmt: skip
    # Past 64 rows: prefill tiles, both operands copied in by TMA (host tensor descriptors);
    # (variant, rows, N, K, groups, ue8m0 scales, weight block, BLOCK_M, BLOCK_N, BLOCK_K, out).
    # V4-Flash's grouped output projection (wo_a: 8 groups of 1024 rows over 4096 columns).
    prefill = (
        ("prefill-4096-ue8m0", 4096, 4096, 4096, 1, True, 128, 64, 128, 128, "bf16"),
        ("prefill256-4096-ue8m0", 256, 4096, 4096, 1, True, 128, 64, 64, 128, "bf16"),
        ("prefill-wq_b-fp32-scales", 4096, 32768, 1024, 1, False, 128, 64, 128, 128, "bf16"),
        ("prefill-4096-fp32-out", 4096, 4096, 4096, 1, True, 128, 64, 128, 128, "fp32"),
        ("prefill-v41-block32", 4096, 5120, 5120, 1, True, 32, 64, 128, 32, "bf16"),
        ("prefill-wo_a-grouped", 4096, 8192, 4096, 8, True, 128, 64, 128, 128, "bf16"),
    )
    for variant, m, n, k, groups, ue8m0, wb, block_m, block_n, block_k, out in prefill:
        yield AotSpec(
            "fp8_prefill._fp8_prefill_kernel",
            variant,
            {"a_desc": f"tensordesc<fp8e4nv[{block_m}, {block_k}]>", "as_ptr": "*fp32",
             "w_desc": f"tensordesc<fp8e4nv[{block_n}, {block_k}]>",
             "ws_ptr": "*u8" if ue8m0 else "*fp32", "out_ptr": f"*{out}", "m": m, "n": n,
             "k": k, "lda": groups * k, "group_n": n // groups, "EMULATE": False,
             "SCALE_UE8M0": ue8m0, "GROUP": 128, "W_BN": wb, "W_BK": wb,
             "BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": block_k},
            num_warps=4,
            num_stages=4,
        )  # fmt: skip
    # Hopper's prefill GEMM (Gluon, async wgmma: sm_90a only): 128-row tiles on eight warps
    # from fp8_wgmma.WIDE_M rows, 64-row tiles on four below; host descriptors carry their
    # shared layouts.
    from deepinfer_kernels_sm100 import fp8_wgmma

    dtypes = {"bf16": torch.bfloat16, "fp32": torch.float32}
    wgmma = (
        ("prefill-4096-ue8m0", 4096, 4096, 4096, 1, True, "bf16"),
        ("prefill256-wq_b-fp32-scales", 256, 32768, 1024, 1, False, "bf16"),
        ("prefill256-wkv-narrow", 256, 512, 4096, 1, True, "bf16"),
        ("prefill-4096-fp32-out", 4096, 4096, 4096, 1, True, "fp32"),
        ("prefill-wo_a-grouped", 4096, 8192, 4096, 8, True, "bf16"),
    )
    for variant, m, n, k, groups, ue8m0, out in wgmma:
        block_m, block_n, warps = fp8_wgmma.tile(m, n, 132)  # an H100/H200's SMs
        a_l, w_l, o_l = fp8_wgmma.shared_layouts(block_m, block_n, dtypes[out])
        yield AotSpec(
            "fp8_wgmma._fp8_wgmma_kernel",
            variant,
            {"a_desc": f"tensordesc<fp8e4nv[{block_m}, 128],{a_l!r}>",
             "w_desc": f"tensordesc<fp8e4nv[{block_n}, 128],{w_l!r}>",
             "out_desc": f"tensordesc<{out}[{block_m}, {block_n}],{o_l!r}>",
             "as_ptr": "*fp32", "ws_ptr": "*u8" if ue8m0 else "*fp32", "m": m, "n": n,
             "k": k, "lda": groups * k, "group_n": n // groups, "SCALE_UE8M0": ue8m0,
             "W_BN": 128, "W_BK": 128, "BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": 128,
             "STAGES": fp8_wgmma.STAGES, "GROUP_M": fp8_wgmma.GROUP_M, "num_warps": warps},
            num_warps=warps,
            archs=(90,),
        )  # fmt: skip
    # the split partial sums, added in order and rounded to the output's dtype
    for out in ("bf16", "fp32"):
        yield AotSpec(
            "fp8_split.split_sum_kernel",
            f"{out}-8-splits",
            {"part_ptr": "*fp32", "out_ptr": f"*{out}", "size": 32 * 1024, "SPLITS": 8,
             "EMULATE": False, "BLOCK": 1024},
        )  # fmt: skip


AOT_SPECS: tuple[AotSpec, ...] = (
    *_norm_specs(),
    *_rope_specs(),
    *_swiglu_specs(),
    *_sampling_specs(),
    *_split_linear_specs(),
    *_verify_plan_specs(),
    *_router_specs(),
    *_mhc_specs(),
    *_moe_specs(),
    *_fp4_moe_specs(),
    *_fp4_gluon_specs(),
    *_fp8_gluon_specs(),
    *_indexer_specs(),
    *_topk_specs(),
    *_attention_specs(),
    *_norm_rope_specs(),
    *_compress_specs(),
    *_compress_verify_specs(),
    *_fp8_linear_specs(),
)


# -- the compile worker (runs in a subprocess: ``python test_aot_compile.py ARCH OUT``) ----------


def _unwrap(obj: object) -> JITFunction[Any] | None:
    """The JITFunction under ``triton.autotune``/``triton.heuristics`` wrappers, or None."""
    from triton.runtime.jit import JITFunction, KernelInterface

    while isinstance(obj, KernelInterface) and not isinstance(obj, JITFunction):
        obj = getattr(obj, "fn", None)
    return obj if isinstance(obj, JITFunction) else None


def _canonical(fn: JITFunction[Any]) -> str:
    return f"{fn.fn.__module__.rsplit('.', 1)[-1]}.{fn.fn.__name__}"


def _discover() -> tuple[dict[str, JITFunction[Any]], dict[str, str]]:
    """Every ``@triton.jit`` function of the package by "<module>.<name>", and every module-level
    name bound to one ("<module>.<alias>" -> its "<module>.<name>")."""
    import importlib
    import pkgutil

    package = importlib.import_module(PACKAGE)
    kernels: dict[str, JITFunction[Any]] = {}
    aliases: dict[str, str] = {}
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"{PACKAGE}.{info.name}")
        for name, obj in vars(module).items():
            fn = _unwrap(obj)
            if fn is None or not fn.fn.__module__.startswith(PACKAGE + "."):
                continue
            kernels[_canonical(fn)] = fn
            aliases[f"{info.name}.{name}"] = _canonical(fn)
    return kernels, aliases


def _bind(
    fn: JITFunction[Any], spec: AotSpec
) -> tuple[dict[str, str], dict[str, Value], dict[tuple[int, ...], list[list[Any]]]]:
    """(signature, constexprs, attrs) for ``triton.compiler.ASTSource``, as ``JITFunction.run``
    derives them from the launch's arguments (triton 3.7's binder): constexpr parameters keep
    their value; a tensor is its pointer type, 16-byte aligned; an int is i32 (i64 past 32
    bits), a constant when it is 1 and divisible by 16 when it is, unless the kernel lists it
    in ``do_not_specialize``; a float is fp32 and a bool u1."""
    names = [p.name for p in fn.params]
    if set(spec.params) != set(names):
        missing, unknown = set(names) - set(spec.params), set(spec.params) - set(names)
        raise ValueError(
            f"{spec.id}: the spec's parameters differ from the kernel's "
            f"(missing {sorted(missing)}, unknown {sorted(unknown)})"
        )
    signature: dict[str, str] = {}
    constexprs: dict[str, Value] = {}
    attrs: dict[tuple[int, ...], list[list[Any]]] = {}
    divisible = [["tt.divisibility", 16]]
    for i, p in enumerate(fn.params):
        value = spec.params[p.name]
        specialize = not p.do_not_specialize
        align = specialize and not p.do_not_specialize_on_alignment
        if p.is_constexpr or value is None:  # (a None argument is a constexpr)
            signature[p.name], constexprs[p.name] = "constexpr", value
        elif p.annotation_type:
            raise ValueError(f"{spec.id}: {p.name} has a type annotation, which _bind ignores")
        elif isinstance(value, str) and value.startswith("tensordesc<"):
            signature[p.name] = value  # a host TMA descriptor: no pointer attributes
        elif isinstance(value, str):
            if not value.startswith("*"):
                raise ValueError(f"{spec.id}: {p.name}={value!r} is not a pointer type")
            signature[p.name] = value
            if align:
                attrs[(i,)] = divisible
        elif isinstance(value, bool):
            signature[p.name] = "u1"
        elif isinstance(value, int):
            if specialize and value == 1:
                signature[p.name], constexprs[p.name] = "constexpr", 1
                continue
            signature[p.name] = "i32" if -(2**31) <= value < 2**31 else "i64"
            if align and value % 16 == 0:
                attrs[(i,)] = divisible
        else:
            signature[p.name] = "fp32"
    return signature, constexprs, attrs


def _ptxas_version(arch: int) -> str | None:
    """The version of the ptxas Triton uses for ``arch`` (its wheel bundles one), or None where
    it is missing or does not run."""
    from triton.backends.nvidia.compiler import get_ptxas

    try:
        return get_ptxas(arch).version
    except RuntimeError:
        return None


def _compile_one(fn: JITFunction[Any], spec: AotSpec, arch: int, cubin: bool) -> dict[str, Any]:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.experimental.gluon._runtime import GluonASTSource, GluonJITFunction

    signature, constexprs, attrs = _bind(fn, spec)
    options: dict[str, Any] = {"num_warps": spec.num_warps, "enable_fp_fusion": spec.fp_fusion}
    if spec.num_stages is not None:
        options["num_stages"] = spec.num_stages
    if spec.maxnreg is not None:
        options["maxnreg"] = spec.maxnreg
    if not cubin:
        options["ptx_version"] = 87  # PTX 8.7 (CUDA 12.8) knows both sm_90a and sm_100a
    source = GluonASTSource if isinstance(fn, GluonJITFunction) else ASTSource
    src = source(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    kernel = triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options)
    ptx = kernel.asm["ptx"]
    target = re.search(r"^\.target\s+(\S+)", ptx, re.MULTILINE)
    return {
        "ok": True,
        "ptx_target": target.group(1) if target else None,
        "ptx_instructions": _entry_instructions(ptx, fn.fn.__name__),
        "cubin_bytes": len(kernel.asm["cubin"]),
        "shared": kernel.metadata.shared,
        "tmem": getattr(kernel.metadata, "tmem_size", None) or 0,
    }


def _entry_instructions(ptx: str, name: str) -> list[str]:
    """The distinct instructions of the kernel's entry in ``ptx`` (up to three; a body that
    the compiler gave up on is a bare ``trap;``)."""
    body = re.search(rf"\.entry {name}\(.*?\n\{{\n(.*?)\n\}}", ptx, re.DOTALL)
    if body is None:
        return []
    seen: list[str] = []
    for line in body.group(1).splitlines():
        text = line.split("//", 1)[0].strip()
        if not text.endswith(";") or text.startswith((".", "$")):
            continue  # directives, declarations, labels
        op = text.split(None, 1)[0].rstrip(";")
        if op not in seen:
            seen.append(op)
            if len(seen) == 3:
                break
    return seen


def _skip_ptxas(*args: Any) -> tuple[str, str] | None:
    """Triton's stage-inspection hook, called bare for a cache key, then with the stages: the
    cubin stage (ptxas) yields no bytes."""
    if not args:
        return "no-ptxas", "no-ptxas"
    args[1]["cubin"] = lambda src, metadata: b""
    return None


def _worker(arch: int, out: Path, *, use_ptxas: bool = True) -> None:
    """Compile every spec for ``arch``; write the results and the discovered kernels to
    ``out`` as JSON. A spec that fails to compile is recorded with its error, not raised."""
    ptxas = _ptxas_version(arch) if use_ptxas else None
    if ptxas is None:
        # No usable ptxas: stop at PTX. Triton asks ptxas its version for the PTX ISA version
        # and the cache key; both are given instead.
        from triton import knobs

        os.environ["TRITON_MOCK_PTX_VERSION"] = "12.8"
        knobs.runtime.add_stages_inspection_hook = _skip_ptxas
    kernels, aliases = _discover()
    results: dict[str, dict[str, Any]] = {}
    for spec in (s for s in AOT_SPECS if arch in s.archs):
        start = time.perf_counter()
        fn = kernels.get(spec.kernel)
        try:
            if fn is None:
                raise LookupError(f"no @triton.jit function {spec.kernel} in {PACKAGE}")
            result = _compile_one(fn, spec, arch, cubin=ptxas is not None)
        except Exception as e:
            detail = "".join(traceback.format_exception_only(type(e), e)).strip()
            result = {"ok": False, "error": detail}
        result["seconds"] = round(time.perf_counter() - start, 3)
        results[spec.id] = result
    report = {
        "arch": arch,
        "ptxas": ptxas,
        "kernels": sorted(kernels),
        "aliases": aliases,
        "results": results,
    }
    out.write_text(json.dumps(report, indent=1))


# -- the tests -----------------------------------------------------------------------------------


def _worker_env(cache: Path) -> dict[str, str]:
    """This environment without Triton's settings (tool paths aside: ``TRITON_PTXAS_PATH``
    etc.), with its own cache directory."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("TRITON_") or k.endswith("_PATH")
    }
    env["TRITON_CACHE_DIR"] = str(cache)
    return env


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[int, dict[str, Any]]:
    """One compile worker per target, in parallel; their reports by arch."""
    root = tmp_path_factory.mktemp("aot")
    procs: dict[int, tuple[subprocess.Popen[str], Path]] = {}
    for arch in ARCHS:
        out = root / f"sm{arch}.json"
        proc = subprocess.Popen(
            [sys.executable, __file__, str(arch), str(out)],
            env=_worker_env(root / f"cache-sm{arch}"),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        procs[arch] = (proc, out)
    reports: dict[int, dict[str, Any]] = {}
    try:
        for arch, (proc, out) in procs.items():
            try:
                log, _ = proc.communicate(timeout=WORKER_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                log, _ = proc.communicate()
                pytest.fail(f"the sm_{arch}a worker ran past {WORKER_TIMEOUT_S}s:\n{log[-4000:]}")
            if proc.returncode != 0 or not out.exists():
                pytest.fail(f"the sm_{arch}a worker failed ({proc.returncode}):\n{log[-4000:]}")
            reports[arch] = json.loads(out.read_text())
    finally:
        for proc, _ in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    return reports


def _launched(aliases: Mapping[str, str]) -> dict[str, list[str]]:
    """Kernels the package launches (``kernel[grid](...)``), with their launch sites."""
    sites: dict[str, list[str]] = {}
    for path in sorted(SRC.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Subscript)
                and isinstance(node.func.value, ast.Name)
            ):
                kernel = aliases.get(f"{path.stem}.{node.func.value.id}")
                if kernel is not None:
                    sites.setdefault(kernel, []).append(f"{path.name}:{node.lineno}")
    return sites


def test_every_launched_kernel_has_an_aot_spec(reports: dict[int, dict[str, Any]]) -> None:
    report = reports[ARCHS[0]]
    launched = _launched(report["aliases"])
    assert launched, "no kernel launches found: the launch scan is broken"
    specced = {spec.kernel for spec in AOT_SPECS}
    missing = {k: v for k, v in launched.items() if k not in specced}
    assert not missing, f"launched kernels without an entry in AOT_SPECS: {missing}"
    stale = specced - set(launched)
    assert not stale, f"AOT_SPECS entries for kernels nothing launches: {sorted(stale)}"
    assert set(launched) <= set(report["kernels"])


def test_spec_ids_are_unique() -> None:
    ids = [spec.id for spec in AOT_SPECS]
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)


@pytest.mark.parametrize("arch", ARCHS, ids=[f"sm_{a}a" for a in ARCHS])
def test_bundled_ptxas_runs(reports: dict[int, dict[str, Any]], arch: int) -> None:
    """Cubins are built only with a working ptxas; without one the compiles stop at PTX, which
    is reported here rather than passed over."""
    if reports[arch]["ptxas"] is None:
        pytest.skip(f"no working ptxas for sm_{arch}a: kernels compiled to PTX only")
    assert re.fullmatch(r"\d+\.\d+", reports[arch]["ptxas"])


@pytest.mark.parametrize(
    ("spec", "arch"),
    [(spec, arch) for spec in AOT_SPECS for arch in spec.archs],
    ids=[f"{spec.id}-sm_{arch}a" for spec in AOT_SPECS for arch in spec.archs],
)
def test_compiles(reports: dict[int, dict[str, Any]], spec: AotSpec, arch: int) -> None:
    report = reports[arch]
    problems = _problems(report["results"][spec.id], arch, cubin=report["ptxas"] is not None)
    known = KNOWN_FAILURES.get((spec.id, arch))
    if known is not None:
        if not problems:
            pytest.fail(f"{spec.id} now compiles for sm_{arch}a: drop it from KNOWN_FAILURES")
        pytest.xfail(f"{known} [{'; '.join(problems)}]")
    assert not problems, f"{spec.id} for sm_{arch}a:\n" + "\n".join(problems)


def _problems(result: Mapping[str, Any], arch: int, *, cubin: bool) -> list[str]:
    """What keeps one compile from giving a kernel that launches on ``sm_<arch>a``."""
    if not result["ok"]:
        return [f"does not compile: {result['error']}"]
    problems: list[str] = []
    if result["ptx_target"] != f"sm_{arch}a":
        problems.append(f"PTX targets {result['ptx_target']}")
    if result["ptx_instructions"] in ([], ["trap"]):
        problems.append(f"PTX entry is {result['ptx_instructions'] or 'missing'}")
    if cubin and not result["cubin_bytes"]:
        problems.append("no cubin")
    if result["shared"] > MAX_SHARED_BYTES:
        problems.append(f"needs {result['shared']} bytes of shared memory of {MAX_SHARED_BYTES}")
    if result["tmem"] > MAX_TMEM_COLUMNS:
        problems.append(f"needs {result['tmem']} tensor-memory columns of {MAX_TMEM_COLUMNS}")
    return problems


if __name__ == "__main__":
    _worker(int(sys.argv[1]), Path(sys.argv[2]))


@pytest.mark.parametrize("arch", ARCHS, ids=[f"sm_{a}a" for a in ARCHS])
def test_wide_attention_specs_follow_the_wrapper(
    arch: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The wide attention programs' columns are chosen by compute capability
    (``attention.wide_block_dv``); the specs compiled for each target must be the ones its
    wrapper picks, or the compile above checks a kernel that never launches there."""
    from deepinfer_kernels_sm100 import attention

    monkeypatch.setattr(attention, "_capability_major", lambda index: arch // 10)
    for dt, pv_parts in (("bf16", attention.PV_PARTS), ("fp32", 0)):
        wide = [
            s
            for s in AOT_SPECS
            if s.kernel == "attention._mqa_sink_kernel"
            and arch in s.archs
            and s.variant.startswith(dt)
            and "wide" in s.variant
        ]
        assert wide, (dt, arch)
        for spec in wide:
            block_h, dim = spec.params["BLOCK_H"], spec.params["dim"]
            want = min(dim, attention.wide_block_dv(torch.device("cuda", 0), pv_parts, block_h))
            assert spec.params["BLOCK_DV"] == want, (spec.id, arch)
            warps = attention.NUM_WARPS if block_h == attention.BLOCK_H else attention.SMALL_WARPS
            if block_h < attention.BLOCK_H and "paged" in spec.variant and dim > attention.BLOCK_DV:
                warps = attention.PAGED_WARPS
            assert spec.num_warps == warps, (spec.id, arch)
