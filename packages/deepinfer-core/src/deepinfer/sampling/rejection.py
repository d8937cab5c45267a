"""Lossless verification of drafted tokens: speculative decoding's rejection sampling.

A drafter proposes tokens x_1..x_l with probabilities q_1..q_l; one target step over the anchor
and the drafts gives the target's distributions p_1..p_{l+1} at those positions. Draft k is
kept with probability min(1, p_k(x_k) / q_k(x_k)), the kept drafts being the prefix before the
first rejection; the token after them is drawn from the residual norm(max(0, p_j - q_j)) at the
first rejection j, or from p_{l+1} when every draft is kept (Leviathan et al. 2023; Chen et al.
2023). Every emitted token is then distributed as the target's own draw at its position,
whatever the drafter proposed. A greedy request passes one-hot distributions (its argmax): a
draft is kept iff it is the target's argmax, and the token after is the argmax itself.

The verification is split at the point where randomness is keyed by position: :func:`accept`
says how many drafts each row keeps (from uniforms the caller draws for the drafts'
positions), :func:`next_distribution` gives the distribution of the token after them, which
the caller samples with the noise of that token's position (the sampler's Gumbel-max).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from deepinfer.sampling import rng
from deepinfer.sampling.sampler import filter_mask

#: Draft probabilities are clamped to at least this (a drafter may assign a token 0 after
#: rounding although it drew it).
MIN_DRAFT_PROB = 1e-8
#: A residual with less mass than this is rounding noise: fall back to the target itself.
MIN_RESIDUAL = 1e-8


def draft_probs_of(q: Tensor | None, drafts: Tensor) -> Tensor:
    """[R, k] the probability each draft had under its proposal ``q`` [R, k, V]; 1 for a
    deterministic drafter (``q`` None: it proposed its argmax)."""
    if q is None:
        return torch.ones(drafts.shape, dtype=torch.float32, device=drafts.device)
    return q.gather(-1, drafts[..., None])[..., 0].float()


def accept(p: Tensor, q: Tensor | None, drafts: Tensor, num_drafts: Tensor, u: Tensor) -> Tensor:
    """[R] long: how many drafts each row keeps.

    ``p`` [R, k + 1, V] target probabilities (row i: the position of draft i + 1; row k: the
    bonus), ``q`` [R, k, V] draft probabilities (None: deterministic drafts), ``drafts``
    [R, k] long, ``num_drafts`` [R] long: drafts each row verifies (<= k; the rest are
    ignored), ``u`` [R, k] uniforms in (0, 1) keyed by each draft's position.
    """
    k = drafts.shape[1]
    target = p[:, :k].gather(-1, drafts[..., None])[..., 0].float()
    ratio = target / draft_probs_of(q, drafts).clamp(min=MIN_DRAFT_PROB)
    ok = u < ratio.clamp(max=1.0)
    ok &= torch.arange(k, device=drafts.device) < num_drafts[:, None]
    return ok.long().cumprod(dim=1).sum(dim=1)  # the kept prefix


def next_distribution(
    p: Tensor, q: Tensor | None, drafts: Tensor, num_drafts: Tensor, kept: Tensor
) -> Tensor:
    """[R, V] the distribution of the token after each row's ``kept`` drafts: the residual
    norm(max(0, p_j - q_j)) at the first rejected draft j, or the target's own distribution
    after the last verified draft (every one kept). Arguments as :func:`accept`."""
    rows = torch.arange(p.shape[0], device=p.device)
    target = p[rows, kept].float()  # row j = kept: the rejected draft's position, or the bonus
    if drafts.shape[1] == 0:  # nothing was drafted (a plain decode row): the target's own
        return target
    rejected = kept < num_drafts
    if q is None:  # deterministic drafts: the residual takes the drafted token out of p
        j = kept.clamp(max=drafts.shape[1] - 1)
        proposal = torch.zeros_like(target).scatter_(-1, drafts[rows, j][:, None], 1.0)
    else:
        proposal = q[rows, kept.clamp(max=q.shape[1] - 1)].float()
    residual = (target - proposal).clamp(min=0.0)
    mass = residual.sum(dim=-1, keepdim=True)
    use = rejected[:, None] & (mass > MIN_RESIDUAL)
    return torch.where(use, residual / mass.clamp(min=MIN_RESIDUAL), target)


def target_distribution(
    logits: Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0
) -> Tensor:
    """[rows, V] what the sampler draws from at each row of ``logits``: one-hot argmax when
    greedy, else the temperature-scaled softmax with min-p, top-k and top-p applied."""
    x = logits.float()
    if temperature <= 0:
        return torch.nn.functional.one_hot(x.argmax(dim=-1), x.shape[-1]).float()
    probs = torch.softmax(x / temperature, dim=-1)
    if top_k <= 0 and top_p >= 1 and min_p <= 0:
        return probs

    def col(v: float, dtype: torch.dtype) -> Tensor:
        return torch.full((probs.shape[0],), v, dtype=dtype, device=x.device)

    keep = filter_mask(
        probs,
        col(max(top_k, 0), torch.int64),
        col(top_p, torch.float32),
        col(min_p, torch.float32),
        top_k > 0 or top_p < 1,
    )
    probs = torch.where(keep, probs, 0.0)
    return probs / probs.sum(dim=-1, keepdim=True)


def acceptance_uniforms(seed: int, first: int, count: int, device: torch.device) -> Tensor:
    """[count] the uniforms that accept or reject drafts at positions ``first ..``: the
    counter RNG on its own stream, so they never share a draw with the sampler's noise."""
    positions = torch.arange(first, first + count)
    u = rng.sampling_uniform(torch.full_like(positions, seed), positions, 1, rng.STREAM_ACCEPT)
    return u[:, 0].to(device)


def verify_sequence(
    p: Tensor, q: Tensor | None, drafts: Tensor, seed: int, start: int
) -> tuple[int, Tensor]:
    """One sequence's round: (drafts kept, [V] the distribution of the token after them), for
    target distributions ``p`` [k + 1, V] from the anchor's position ``start`` on and drafts
    [k] at positions ``start + 1 ..`` drawn from ``q`` [k, V] (None: deterministic drafts),
    accepted with the uniforms of their positions (:func:`acceptance_uniforms`)."""
    k, device = drafts.numel(), p.device
    u = acceptance_uniforms(seed, start + 1, k, device)[None]
    num = torch.tensor([k], device=device)
    d = drafts.to(device)[None]
    q_rows = None if q is None else q[None]
    kept = accept(p[None], q_rows, d, num, u)
    return int(kept[0]), next_distribution(p[None], q_rows, d, num, kept)[0]


def draw(
    dist: Tensor,
    temperature: float,
    seed: int,
    position: int,
    uniform: Callable[[Tensor, Tensor, int], Tensor] = rng.sampling_uniform,
) -> int:
    """The token at ``position`` from ``dist`` [V] with the sampler's Gumbel noise there
    (``uniform``: a backend's fused RNG, the same bits); the argmax when greedy."""
    if temperature <= 0:
        return int(dist.argmax())
    seeds = torch.tensor([seed], device=dist.device)
    at = torch.tensor([position], device=dist.device)
    noise = rng.gumbel(uniform(seeds, at, dist.shape[-1]))[0]
    return int(torch.argmax(torch.log(dist) + noise))
