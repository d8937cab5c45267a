"""The MoE router after its gate matmul: scores, top-k experts and their weights in one kernel.

The reference turns the gate's fp32 logits into scores (``sqrt(softplus)``, sigmoid or softmax),
adds the selection bias, takes the top-k, gathers the unbiased scores of the chosen experts,
normalises and scales them: about ten launches per MoE layer for a [tokens, experts] tensor of
a few KB, which in a captured decode step cost more in launches than in work. Here one program
per token does all of it in registers. The k experts come out in descending biased score
(equal scores to the lower expert id), as the reference's sorted ``topk`` returns them; hash
layers pass their fixed experts and only gather and normalise.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

#: scoring functions by name, as the checkpoint's config names them
SCORING = {"sqrtsoftplus": 0, "sigmoid": 1, "softmax": 2}
MAX_EXPERTS = 1024
MAX_TOPK = 16


@triton.jit
def _softplus(x):
    """torch's softplus (threshold 20), log1p by Goldberg's rule so tiny exp(x) keep their
    relative precision."""
    y = tl.exp(tl.minimum(x, 20.0))
    u = 1.0 + y
    exact = u == 1.0
    log1p = tl.where(exact, y, tl.log(u) * (y / tl.where(exact, 1.0, u - 1.0)))
    return tl.where(x > 20.0, x, log1p)


@triton.jit(do_not_specialize=["experts"])
def _route_kernel(  # noqa: PLR0917 (Triton kernels take positional arguments)
    logits_ptr,  # [N, E] fp32
    bias_ptr,  # [E] fp32 (HAS_BIAS)
    fixed_ptr,  # [N, K] int (FIXED)
    weights_ptr,  # [N, K] fp32 out
    indices_ptr,  # [N, K] int64 out
    experts,
    scaling,
    K: tl.constexpr,
    K_PAD: tl.constexpr,
    E_PAD: tl.constexpr,
    SCORING: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    FIXED: tl.constexpr,
    NORM: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    e = tl.arange(0, E_PAD)
    ok = e < experts
    x = tl.load(logits_ptr + row * experts + e, mask=ok, other=0.0)
    if SCORING == 0:
        scores = tl.sqrt(_softplus(x))
    elif SCORING == 1:
        scores = tl.sigmoid(x)
    else:
        x = tl.where(ok, x, float("-inf"))
        p = tl.exp(x - tl.max(x, 0))
        scores = p / tl.sum(p, 0)
    j = tl.arange(0, K_PAD)
    if FIXED:
        idx = tl.load(fixed_ptr + row * K + j, mask=j < K, other=0).to(tl.int32)
    else:
        biased = scores
        if HAS_BIAS:
            biased = scores + tl.load(bias_ptr + e, mask=ok, other=0.0)
        biased = tl.where(ok, biased, float("-inf"))
        idx = tl.zeros([K_PAD], dtype=tl.int32)
        for i in tl.static_range(K):
            best = tl.argmax(biased, 0, tie_break_left=True).to(tl.int32)
            idx = tl.where(j == i, best, idx)
            biased = tl.where(e == best, float("-inf"), biased)
    chosen = e[None, :] == idx[:, None]  # [K_PAD, E_PAD]
    w = tl.sum(tl.where(chosen, scores[None, :], 0.0), 1)
    w = tl.where(j < K, w, 0.0)
    if NORM:
        w = w / (tl.sum(w, 0) + 1e-20)
    tl.store(weights_ptr + row * K + j, w * scaling, mask=j < K)
    tl.store(indices_ptr + row * K + j, idx.to(tl.int64), mask=j < K)


def fits(experts: int, topk: int, scoring_func: str) -> bool:
    """Whether the kernel covers this router (else the reference runs)."""
    return scoring_func in SCORING and experts <= MAX_EXPERTS and 0 < topk <= MAX_TOPK


def route(
    logits: Tensor,
    bias: Tensor | None,
    *,
    topk: int,
    scoring_func: str,
    routed_scaling_factor: float,
    norm_topk_prob: bool,
    fixed_indices: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """(weights [N, k] fp32, experts [N, k] int64) from the gate's fp32 logits [N, E]."""
    n, experts = logits.shape
    logits = logits.float().contiguous()
    weights = torch.empty(n, topk, dtype=torch.float32, device=logits.device)
    indices = torch.empty(n, topk, dtype=torch.long, device=logits.device)
    if n:
        _route_kernel[(n,)](
            logits,
            bias.float().contiguous() if bias is not None else logits,
            fixed_indices.contiguous() if fixed_indices is not None else indices,
            weights,
            indices,
            experts,
            float(routed_scaling_factor),
            K=topk,
            K_PAD=max(2, triton.next_power_of_2(topk)),
            E_PAD=max(16, triton.next_power_of_2(experts)),
            SCORING=SCORING[scoring_func],
            HAS_BIAS=bias is not None,
            FIXED=fixed_indices is not None,
            NORM=norm_topk_prob,
        )
    return weights, indices
