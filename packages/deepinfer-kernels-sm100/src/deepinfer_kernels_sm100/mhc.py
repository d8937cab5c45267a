"""mHC weights in one kernel: pre/post gates and the Sinkhorn-normalised residual mix.

In plain torch the 20 Sinkhorn iterations on tiny [n, n] matrices (n = ``hc_mult`` = 4) are about
120 kernel launches per sublayer, twelve sublayers per token step on the tiny model, so a decode
step spent more time launching them than computing anything. Here one program normalises a block
of rows' matrices entirely in registers, with the reference's order of operations (softmax, + eps,
column, then ``iters - 1`` times row and column, each divided by sum + eps).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

#: Rows (tokens x streams matrices) per program.
BLOCK_ROWS = 16


@triton.jit
def _mhc_weights_kernel(  # noqa: PLR0917 (Triton kernels take positional arguments)
    mix_ptr,
    base_ptr,
    scale_ptr,
    pre_ptr,
    post_ptr,
    comb_ptr,
    rows,
    iters,
    hc_eps,
    N: tl.constexpr,
    NP: tl.constexpr,
    BLOCK: tl.constexpr,
):
    width: tl.constexpr = (2 + N) * N
    r = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    i = tl.arange(0, NP)
    rmask = r < rows

    # pre / post gates: [BLOCK, NP]
    vec_mask = rmask[:, None] & (i[None, :] < N)
    s_pre = tl.load(scale_ptr)
    s_post = tl.load(scale_ptr + 1)
    s_comb = tl.load(scale_ptr + 2)
    pre_l = tl.load(mix_ptr + r[:, None] * width + i[None, :], mask=vec_mask, other=0.0)
    post_l = tl.load(mix_ptr + r[:, None] * width + N + i[None, :], mask=vec_mask, other=0.0)
    b_pre = tl.load(base_ptr + i, mask=i < N, other=0.0)
    b_post = tl.load(base_ptr + N + i, mask=i < N, other=0.0)
    pre = tl.sigmoid(pre_l * s_pre + b_pre[None, :]) + hc_eps
    post = 2.0 * tl.sigmoid(post_l * s_post + b_post[None, :])
    tl.store(pre_ptr + r[:, None] * N + i[None, :], pre, mask=vec_mask)
    tl.store(post_ptr + r[:, None] * N + i[None, :], post, mask=vec_mask)

    # comb: [BLOCK, NP, NP], element (i, j) at 2N + i*N + j
    ii = i[None, :, None]
    jj = i[None, None, :]
    inside = (ii < N) & (jj < N)
    mask = rmask[:, None, None] & inside
    cell = ii * N + jj
    logits = tl.load(mix_ptr + r[:, None, None] * width + 2 * N + cell, mask=mask, other=0.0)
    b_comb = tl.load(base_ptr + 2 * N + cell, mask=inside, other=0.0)
    logits = logits * s_comb + b_comb
    logits = tl.where(jj < N, logits, float("-inf"))
    top = tl.max(logits, axis=2)
    e = tl.exp(logits - top[:, :, None])
    e = tl.where(inside, e, 0.0)
    comb = e / tl.sum(e, axis=2)[:, :, None] + hc_eps
    comb = tl.where(inside, comb, 0.0)
    comb = comb / (tl.sum(comb, axis=1)[:, None, :] + hc_eps)
    for _ in range(iters - 1):
        comb = comb / (tl.sum(comb, axis=2)[:, :, None] + hc_eps)
        comb = comb / (tl.sum(comb, axis=1)[:, None, :] + hc_eps)
    tl.store(comb_ptr + r[:, None, None] * (N * N) + cell, comb, mask=mask)


def mhc_weights_from_mix(
    mix: Tensor, base: Tensor, scale: Tensor, *, hc: int, hc_eps: float, sinkhorn_iters: int
) -> tuple[Tensor, Tensor, Tensor]:
    """(pre [..., n], post [..., n], comb [..., n, n]) fp32 from the mixer output [..., (2+n)n]."""
    lead = mix.shape[:-1]
    flat = mix.reshape(-1, mix.shape[-1]).float().contiguous()
    rows = flat.shape[0]
    pre = torch.empty(rows, hc, dtype=torch.float32, device=mix.device)
    post = torch.empty_like(pre)
    comb = torch.empty(rows, hc, hc, dtype=torch.float32, device=mix.device)
    if rows:
        grid = (triton.cdiv(rows, BLOCK_ROWS),)
        _mhc_weights_kernel[grid](
            flat,
            base.float().contiguous(),
            scale.float().contiguous(),
            pre,
            post,
            comb,
            rows,
            sinkhorn_iters,
            hc_eps,
            N=hc,
            NP=triton.next_power_of_2(hc),
            BLOCK=BLOCK_ROWS,
        )
    return pre.view(*lead, hc), post.view(*lead, hc), comb.view(*lead, hc, hc)
