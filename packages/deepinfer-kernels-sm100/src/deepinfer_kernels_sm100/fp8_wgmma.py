"""The FP8 block-scaled linear's prefill tiles on Hopper, written in Gluon around async wgmma.

Block scaling multiplies each 128-wide K step's product by its scales before adding it to
the fp32 sum (:mod:`.fp8_linear`). Triton's ``acc += tl.dot(a, w.T) * scale``
(:mod:`.fp8_prefill`) waits for each step's wgmma before scaling it, so the tensor cores idle
while the CUDA cores promote (``benchmarks/results/low_precision_h200.json``). Here, as
DeepGEMM does, step i's wgmma is issued asynchronously into a fresh accumulator and step
i - 1's retired (``warpgroup_mma_wait(1)``) and promoted while step i runs: Gluon (Triton's
explicit-layout dialect) exposes the asynchronous wgmma and its wait, which ``tl.dot`` hides.

* Operands arrive by TMA into a ring of ``STAGES`` shared-memory slots, one mbarrier each; a
  slot is refilled once the wgmma that read it has retired, so ``STAGES - 1`` steps are in
  flight beyond the one on the tensor cores.
* Two accumulators take turns (the loop unrolled by two): with one ``prev = cur`` hand-over
  the loop's back edge copies registers the running wgmma is still writing, and ptxas then
  serialises every wgmma (its warning C7514). :func:`_pin` keeps each promotion ahead of the
  next wgmma's issue for the same reason (LLVM would sink the pure FMAs below it).
* Tiles: 128 x 128 on two warpgroups from :data:`WIDE_M` rows, 64 x 128 on one below (more
  programs; two fit an SM), 64 x 64 where even those would leave SMs idle. Rows past M come
  back from TMA as zeros and the TMA store of the output clips them.

The sums are the Triton kernel's, in its order: the same bits (``test_fp8_linear_kernel.py``
on a GPU). Gluon kernels do not run in Triton's interpreter, so CI compiles this one for
sm_90a (``test_aot_compile.py``) and the interpreter tests run the Triton kernel, which also
serves Blackwell (no wgmma) and weight blocks narrower than a step (V4.1's 32 x 32).
"""

from __future__ import annotations

from typing import Any

import torch
import triton
from torch import Tensor

from deepinfer_kernels_sm100.devices import sm_count
from deepinfer_kernels_sm100.gluon_support import on_hopper

try:  # Gluon ships with Triton 3.5 and later
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        tma,
        warpgroup_mma,
        warpgroup_mma_wait,
    )
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    HAVE_GLUON = True
except ImportError:  # pragma: no cover - older Triton: the Triton kernel serves
    HAVE_GLUON = False

#: Rows from which the 128-row tiles on eight warps run (each weight tile serves twice the
#: rows, one program to an SM); below, 64-row tiles on four warps give more programs.
WIDE_M = 1024
STAGES = 4  # copies in flight (shared-memory slots of one A and one W tile each)
#: Row tiles that walk down one column tile before the next (the weight tile stays in L2).
GROUP_M = 8
#: K columns per step: one activation group, and the weight block's width or a divisor.
BLOCK_K = 128
#: Tile columns; 64 where 128 would leave SMs idle (few columns, a short batch).
BLOCK_N = 128
NARROW_N = 64
_OUT_GL = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}


def usable(device: torch.device, block: tuple[int, int], group_n: int) -> bool:
    """Whether this kernel runs the prefill GEMM: on a Hopper GPU with Gluon
    (:func:`.gluon_support.on_hopper`), weight blocks of whole 128-column steps and 128-row
    tiles, and column groups of whole tiles."""
    if not on_hopper(device):
        return False
    return block[0] % BLOCK_N == 0 and block[1] % BLOCK_K == 0 and group_n % BLOCK_N == 0


if HAVE_GLUON:

    @gluon.constexpr_function
    def _mma_layout(block_m: Any, block_n: Any, num_warps: Any) -> Any:
        """The wgmma accumulator: warps stacked along M (16 rows each: one warpgroup per 64
        rows), one instruction over the whole tile width (k = 32 for 8-bit operands)."""
        return gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, block_n, 32]
        )

    @gluon.jit
    def _ue8m0_to_fp32(b):
        """2**(b - 127) from exponent bytes, as :func:`.fp8_quant.ue8m0_to_fp32`."""
        b = b.to(gl.int32)
        bits = gl.where(b == 0, 0x00400000, b << 23)
        bits = gl.where(b == 255, 0x7FC00000, bits)
        return bits.to(gl.float32, bitcast=True)

    @gluon.jit
    def _pin(x):
        """``x`` through a side-effecting register move: the promotion's FMAs stay before the
        next wgmma's issue (see the module)."""
        return gl.inline_asm_elementwise(
            "mov.b32 $0, $1;", "=r,r", [x], dtype=gl.float32, is_pure=False, pack=1
        )

    @gluon.jit
    def _load_step(src, ring, kb, k_tiles, STAGES: gl.constexpr, BLOCK_K: gl.constexpr):  # noqa: PLR0917
        """Start the copies of K step ``kb`` into slot ``kb % STAGES`` (none past the last).
        ``src``: (A's descriptor, W's, the tile's row, A's first column, the tile's column);
        ``ring``: (A's slots, W's slots, their barriers)."""
        a_desc, w_desc, off_m, a_col, off_n = src
        a_bufs, w_bufs, ready = ring
        s = kb % STAGES
        pred = kb < k_tiles
        bar = ready.index(s)
        k0 = kb * BLOCK_K
        mbarrier.expect(bar, a_desc.block_type.nbytes + w_desc.block_type.nbytes, pred=pred)
        tma.async_copy_global_to_shared(
            a_desc, [off_m, a_col + k0], bar, a_bufs.index(s), pred=pred
        )
        tma.async_copy_global_to_shared(w_desc, [off_n, k0], bar, w_bufs.index(s), pred=pred)

    @gluon.jit
    def _issue_step(  # noqa: PLR0917
        ring,
        acc,
        kb,
        scales,
        STAGES: gl.constexpr,
        STEPS_PER_W: gl.constexpr,
        SCALE_UE8M0: gl.constexpr,
    ):
        """Wait for step ``kb``'s operands, start its wgmma from zero into ``acc``'s registers
        and load its scales per row (needed once the wgmma retires: the load hides behind).
        ``scales``: (the rows' activation scales, which rows are in range, the weight's)."""
        a_bufs, w_bufs, ready = ring
        a_scales, row_ok, w_scales = scales
        s = kb % STAGES
        mbarrier.wait(ready.index(s), (kb // STAGES) & 1)
        acc = warpgroup_mma(
            a_bufs.index(s), w_bufs.index(s).permute((1, 0)), acc, use_acc=False, is_async=True
        )
        w_scale = gl.load(w_scales + kb // STEPS_PER_W)
        if SCALE_UE8M0:
            w_scale = _ue8m0_to_fp32(w_scale)
        scale = gl.load(a_scales + kb, mask=row_ok, other=0.0) * w_scale
        return acc, scale

    @gluon.jit
    def _turn(  # noqa: PLR0917
        src,
        ring,
        scales,
        acc,
        kb,
        held,
        held_scale,
        total,
        k_tiles,
        STAGES: gl.constexpr,
        STEPS_PER_W: gl.constexpr,
        SCALE_UE8M0: gl.constexpr,
        BLOCK_K: gl.constexpr,
    ):
        """One half of the unrolled loop: issue step ``kb`` into ``acc``, retire the step
        before it (``held``, issued into the other accumulator, whose registers come back
        for its next step) and promote it into ``total``, then refill that step's slot with
        step ``kb - 1 + STAGES``."""
        acc, scale = _issue_step(ring, acc, kb, scales, STAGES, STEPS_PER_W, SCALE_UE8M0)
        held = warpgroup_mma_wait(num_outstanding=1, deps=(held,))
        total = _pin(total + held * held_scale[:, None])
        # step kb - 1's slot is free: its wgmma retired (and, by the barrier Triton puts
        # before the copy, the other warpgroup's too)
        _load_step(src, ring, kb - 1 + STAGES, k_tiles, STAGES, BLOCK_K)
        return acc, scale, held, total

    @gluon.jit(do_not_specialize=["m"])
    def _fp8_wgmma_kernel(  # noqa: PLR0917 (Gluon kernels take positional arguments)
        a_desc,  # [M, lda] e4m3, [BLOCK_M, BLOCK_K] boxes
        w_desc,  # [N, K] e4m3, [BLOCK_N, BLOCK_K] boxes
        out_desc,  # [M, N], [BLOCK_M, BLOCK_N] boxes
        as_ptr,  # [M, lda / BLOCK_K] fp32 activation scales
        ws_ptr,  # [ceil(N / W_BN), ceil(K / W_BK)] weight scales: fp32, or ue8m0 bytes
        m,
        n,
        k,
        lda,  # elements between rows of A: K, or groups * K for a grouped linear
        group_n,  # output columns per group: column c reads A's columns from (c // group_n) * K
        SCALE_UE8M0: gl.constexpr,
        W_BN: gl.constexpr,
        W_BK: gl.constexpr,
        BLOCK_M: gl.constexpr,
        BLOCK_N: gl.constexpr,
        BLOCK_K: gl.constexpr,
        STAGES: gl.constexpr,
        GROUP_M: gl.constexpr,
        num_warps: gl.constexpr,
    ):
        """out = sum over K steps of dot(a, w.T) * a_scale[:, None] * w_scale, in fp32; a
        tile's columns lie in one weight block (W_BN % BLOCK_N == 0), so its weight scale
        is one value per step."""
        gl.static_assert(W_BN % BLOCK_N == 0 and W_BK % BLOCK_K == 0 and STAGES >= 2)
        pid = gl.program_id(0)
        tiles_m = gl.cdiv(m, BLOCK_M)
        per_group = GROUP_M * (n // BLOCK_N)
        first_m = pid // per_group * GROUP_M
        group_rows = gl.minimum(tiles_m - first_m, GROUP_M)
        off_m = (first_m + (pid % per_group) % group_rows) * BLOCK_M
        off_n = (pid % per_group) // group_rows * BLOCK_N
        a_col = off_n // group_n * k
        k_tiles = k // BLOCK_K

        layout: gl.constexpr = _mma_layout(BLOCK_M, BLOCK_N, num_warps)
        a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES, BLOCK_M, BLOCK_K], a_desc.layout)
        w_bufs = gl.allocate_shared_memory(w_desc.dtype, [STAGES, BLOCK_N, BLOCK_K], w_desc.layout)
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES):
            mbarrier.init(ready.index(i), count=1)
        fence_async_shared()  # the barriers' init visible to the copy engine
        src = (a_desc, w_desc, off_m, a_col, off_n)
        ring = (a_bufs, w_bufs, ready)
        for i in gl.static_range(STAGES):
            _load_step(src, ring, i, k_tiles, STAGES, BLOCK_K)

        rows = off_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, layout))
        row_ok = rows < m
        a_scales = as_ptr + rows.to(gl.int64) * (lda // BLOCK_K) + a_col // BLOCK_K
        w_scales = ws_ptr + off_n // W_BN * gl.cdiv(k, W_BK)
        scales = (a_scales, row_ok, w_scales)
        per_w: gl.constexpr = W_BK // BLOCK_K

        # X and Y take turns: one computes step kb while the other, holding kb - 1, is
        # promoted into ``total``. Step 0 is peeled: X in flight on entry to each iteration.
        acc_x = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=layout)
        acc_y = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=layout)
        total = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=layout)
        acc_x, scale_x = _issue_step(ring, acc_x, 0, scales, STAGES, per_w, SCALE_UE8M0)
        for kb in range(1, k_tiles - 1, 2):
            acc_y, scale_y, acc_x, total = _turn(
                src, ring, scales, acc_y, kb, acc_x, scale_x, total, k_tiles,
                STAGES, per_w, SCALE_UE8M0, BLOCK_K,
            )  # fmt: skip
            acc_x, scale_x, acc_y, total = _turn(
                src, ring, scales, acc_x, kb + 1, acc_y, scale_y, total, k_tiles,
                STAGES, per_w, SCALE_UE8M0, BLOCK_K,
            )  # fmt: skip
        # X holds the last step issued; with an even step count one more is left
        if k_tiles % 2 == 0:
            last, last_scale = _issue_step(
                ring, acc_y, k_tiles - 1, scales, STAGES, per_w, SCALE_UE8M0
            )
            part_x = warpgroup_mma_wait(num_outstanding=1, deps=(acc_x,))
            total += part_x * scale_x[:, None]
            part_y = warpgroup_mma_wait(num_outstanding=0, deps=(last,))
            total += part_y * last_scale[:, None]
        else:
            part_x = warpgroup_mma_wait(num_outstanding=0, deps=(acc_x,))
            total += part_x * scale_x[:, None]
        for i in gl.static_range(STAGES):
            mbarrier.invalidate(ready.index(i))

        out_smem = gl.allocate_shared_memory(out_desc.dtype, [BLOCK_M, BLOCK_N], out_desc.layout)
        out_smem.store(total.to(out_desc.dtype))
        fence_async_shared()
        tma.async_copy_shared_to_global(out_desc, [off_m, off_n], out_smem)
        tma.store_wait(pendings=0)


def tile(m: int, n: int, sms: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, warps) for ``m`` rows and ``n`` columns on ``sms`` SMs."""
    if m >= WIDE_M:
        return 128, BLOCK_N, 8
    narrow = triton.cdiv(m, 64) * (n // BLOCK_N) < sms
    return 64, NARROW_N if narrow else BLOCK_N, 4


def shared_layouts(block_m: int, block_n: int, out_dtype: torch.dtype) -> tuple[Any, Any, Any]:
    """The swizzled shared-memory layouts of the A, W and output boxes."""
    out = getattr(gl, _OUT_GL[out_dtype])
    return (
        gl.NVMMASharedLayout.get_default_for([block_m, BLOCK_K], gl.float8e4nv),
        gl.NVMMASharedLayout.get_default_for([block_n, BLOCK_K], gl.float8e4nv),
        gl.NVMMASharedLayout.get_default_for([block_m, block_n], out),
    )


def fp8_wgmma_gemm(  # noqa: PLR0917
    a: Tensor,
    a_scale: Tensor,
    w: Tensor,
    ws: Tensor,
    out: Tensor,
    block: tuple[int, int],
    groups: int,
    *,
    ue8m0: bool,
) -> None:
    """Write ``out`` [M, N] from quantised activations ``a`` [M, groups * K] with their scales
    and the checked weight operands (as :func:`.fp8_prefill.fp8_prefill_gemm` takes them);
    :func:`usable` must hold."""
    (n, k), m = w.shape, a.shape[0]
    block_m, block_n, warps = tile(m, n, sm_count(a.device))
    a_layout, w_layout, out_layout = shared_layouts(block_m, block_n, out.dtype)
    grid = (triton.cdiv(m, block_m) * (n // block_n),)
    _fp8_wgmma_kernel[grid](
        TensorDescriptor.from_tensor(a, [block_m, BLOCK_K], a_layout),
        TensorDescriptor.from_tensor(w, [block_n, BLOCK_K], w_layout),
        TensorDescriptor.from_tensor(out, [block_m, block_n], out_layout),
        a_scale,
        ws,
        m,
        n,
        k,
        groups * k,
        n // groups,
        SCALE_UE8M0=ue8m0,
        W_BN=block[0],
        W_BK=block[1],
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=BLOCK_K,
        STAGES=STAGES,
        GROUP_M=GROUP_M,
        num_warps=warps,
    )
