"""Manifold-constrained hyper-connection (mHC) weight maths of the torch reference.

A block's hyper-connection mixer yields, per token, ``(2 + n) * n`` numbers for ``n`` residual
streams: the weights that collapse the streams into the block's input (``pre``), the weights
that spread its output back (``post``) and the stream-to-stream mixing matrix (``comb``), made
nearly doubly stochastic by Sinkhorn normalisation.

It is a module of its own, apart from :class:`~deepinfer.backends.torch_ref.TorchBackend`,
because it is pure maths on the mixer's output: it is the float reference that fused kernels
(``deepinfer_kernels_sm100.mhc_fused.mhc_entry``) are tested against, and :func:`sinkhorn` is
checked on its own.
"""

from __future__ import annotations

import torch
from torch import Tensor


def sinkhorn(logits: Tensor, iters: int, eps: float) -> Tensor:
    """Project [..., n, n] logits towards a doubly-stochastic matrix (softmax, then alternate
    column/row normalisation): part of ``mhc_pre``, not an op of its own.

    The matrices are laid out [n, n, tokens] for the loop, so that every sum runs along the
    tokens (a reduction over an outer dim) instead of over n strided elements per token: the
    same additions in the same order, so the same bits, several times faster for many tokens.
    """
    n = logits.shape[-1]
    comb = torch.softmax(logits.float(), dim=-1) + eps
    tokens = comb.numel() // (n * n)
    m = comb.reshape(tokens, n * n).t().contiguous().view(n, n, tokens)  # m[i, j, token]
    m = m / (m.sum(dim=0, keepdim=True) + eps)
    for _ in range(iters - 1):  # out of place: training differentiates through this
        m = m / (m.sum(dim=1, keepdim=True) + eps)
        m = m / (m.sum(dim=0, keepdim=True) + eps)
    return m.reshape(n * n, tokens).t().reshape(comb.shape)


def mhc_weights_from_mix(
    mix: Tensor, base: Tensor, scale: Tensor, *, hc: int, hc_eps: float, sinkhorn_iters: int
) -> tuple[Tensor, Tensor, Tensor]:
    """(pre [..., n], post [..., n], comb [..., n, n]) fp32 from the mixer output [..., (2+n)n].

    ``scale`` [3] scales the three parts and ``base`` [(2+n)n] shifts them; ``hc`` is ``n``.
    """
    n = hc
    base = base.float()
    scale = scale.float()
    pre = torch.sigmoid(mix[..., :n] * scale[0] + base[:n]) + hc_eps
    post = 2 * torch.sigmoid(mix[..., n : 2 * n] * scale[1] + base[n : 2 * n])
    comb_logits = mix[..., 2 * n :] * scale[2] + base[2 * n :]
    comb = sinkhorn(comb_logits.unflatten(-1, (n, n)), sinkhorn_iters, hc_eps)
    return pre, post, comb
