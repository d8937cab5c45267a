"""The FP8 block-scaled linear's prefill tiles, fed by the tensor memory accelerator (TMA).

Past :data:`~.fp8_linear.SMALL_M` rows each weight tile is reused by many rows and the kernel
is bound by the tensor cores' issue, not by bytes, so what each K step costs besides its dot
matters. Here the copy engine brings both operand tiles into shared memory (host tensor
descriptors, one per operand), so the kernel's warps compute no addresses or masks for them
and the software pipeline waits on the copy's barrier, not on per-thread copies. The maths is
:func:`~.fp8_linear._fp8_gemm_kernel`'s without the K split or the in-kernel quantisation (a
prefill batch quantises its activations once, ahead): the same products, scaled and summed in
the same order, so both kernels give the same bits. Rows past M come back as zeros from the
copy and are never stored.

Every GPU this backend runs on (compute capability 9.0 and up) has TMA; Triton's interpreter
emulates the descriptors, so the tests run this kernel on the CPU as well. On Hopper the
launch takes :mod:`.fp8_wgmma`'s kernel instead where it applies: the same sums, with each K
step's promotion overlapped with the next step's tensor-core work, which ``tl.dot`` cannot
express.
"""

from __future__ import annotations

import triton
import triton.language as tl
from torch import Tensor
from triton.tools.tensor_descriptor import TensorDescriptor

from deepinfer_kernels_sm100 import fp8_wgmma
from deepinfer_kernels_sm100.fp8_quant import ACT_GROUP, EMULATE_CAST, ue8m0_to_fp32
from deepinfer_kernels_sm100.fp8_split import store_rounded


@triton.jit(do_not_specialize=["m"])
def _fp8_prefill_kernel(  # noqa: PLR0917 (Triton kernels take positional arguments)
    a_desc,  # [M, lda] e4m3 activations, [BLOCK_M, BLOCK_K] boxes
    as_ptr,  # [M, lda / GROUP] fp32 activation scales
    w_desc,  # [N, K] e4m3 weight, [BLOCK_N, BLOCK_K] boxes
    ws_ptr,  # [ceil(N / W_BN), ceil(K / W_BK)] weight scales: fp32, or ue8m0 bytes
    out_ptr,  # [M, N] out
    m,
    n,
    k,
    lda,  # elements between rows of A: K, or groups * K for a grouped linear
    group_n,  # output columns per group: column c reads A's columns from (c // group_n) * K
    EMULATE: tl.constexpr,
    SCALE_UE8M0: tl.constexpr,
    GROUP: tl.constexpr,
    W_BN: tl.constexpr,
    W_BK: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """out = sum over K steps of dot(a, w.T) * a_scale[:, None] * w_scale[None, :], in fp32
    (BLOCK_K divides GROUP and W_BK; BLOCK_N divides N and group_n)."""
    tl.static_assert(GROUP % BLOCK_K == 0 and W_BK % BLOCK_K == 0)
    col0 = tl.program_id(0) * BLOCK_N
    row0 = tl.program_id(1) * BLOCK_M
    rows = row0 + tl.arange(0, BLOCK_M)
    cols = col0 + tl.arange(0, BLOCK_N)
    row_ok = rows < m
    a_col0 = (col0 // group_n) * k
    a_scales = as_ptr + rows.to(tl.int64) * (lda // GROUP) + a_col0 // GROUP
    w_scales = ws_ptr + (cols // W_BN) * tl.cdiv(k, W_BK)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, k, BLOCK_K):
        a = a_desc.load([row0, a_col0 + k0])
        w = w_desc.load([col0, k0])
        a_scale = tl.load(a_scales + k0 // GROUP, mask=row_ok, other=0.0)
        w_scale = tl.load(w_scales + k0 // W_BK)
        if SCALE_UE8M0:
            w_scale = ue8m0_to_fp32(w_scale)
        part = tl.dot(a, tl.trans(w))
        acc += part * (a_scale[:, None] * w_scale[None, :])
    out = rows[:, None].to(tl.int64) * n + cols[None, :]
    store_rounded(out_ptr + out, acc, row_ok[:, None], EMULATE)


def fp8_prefill_gemm(  # noqa: PLR0917
    a: Tensor,
    a_scale: Tensor,
    w: Tensor,
    ws: Tensor,
    out: Tensor,
    block: tuple[int, int],
    tile: tuple[int, int, int],
    groups: int,
    *,
    ue8m0: bool,
    num_warps: int,
    num_stages: int,
) -> None:
    """Write ``out`` [M, N] from quantised activations ``a`` [M, groups * K] with their scales
    and the checked weight operands of :func:`~.fp8_linear._weight_operands`, in ``tile`` =
    (BLOCK_M, BLOCK_N, BLOCK_K) tiles, ``num_stages`` copies in flight (on Hopper, by
    :mod:`.fp8_wgmma` where it applies: its own tiles)."""
    (n, k), m = w.shape, a.shape[0]
    if fp8_wgmma.usable(a.device, block, n // groups):
        fp8_wgmma.fp8_wgmma_gemm(a, a_scale, w, ws, out, block, groups, ue8m0=ue8m0)
        return
    block_m, block_n, block_k = tile
    _fp8_prefill_kernel[(n // block_n, triton.cdiv(m, block_m))](
        TensorDescriptor.from_tensor(a, [block_m, block_k]),
        a_scale,
        TensorDescriptor.from_tensor(w, [block_n, block_k]),
        ws,
        out,
        m,
        n,
        k,
        groups * k,
        n // groups,
        EMULATE=EMULATE_CAST,
        SCALE_UE8M0=ue8m0,
        GROUP=ACT_GROUP,
        W_BN=block[0],
        W_BK=block[1],
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        num_warps=num_warps,
        num_stages=num_stages,
    )
