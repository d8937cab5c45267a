"""The sampler: penalties, temperature, min-p/top-k/top-p, Gumbel-max draws, logprobs.

Every operation is row-wise, so a row's result never depends on the other rows of the batch.
Sampling is Gumbel-max, ``argmax(logits / T + g)``, with the noise ``g`` drawn from the counter RNG
keyed by (seed, position): a seeded request is reproducible across batch compositions, chunking,
preemption and devices. Ties (equal logits at a top-k or top-p boundary, equal maxima) resolve
towards the lower token id, always.

Filter semantics, each applied to the renormalised survivors of the previous one:
``min_p`` keeps tokens with p >= min_p * p_max; ``top_k`` keeps the k most likely; ``top_p`` keeps
the shortest most-likely prefix whose mass reaches top_p. The most likely token always survives.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from deepinfer.sampling import rng

if TYPE_CHECKING:
    from deepinfer.backends.base import Backend


@dataclass
class SamplingTensors:
    """Per-row sampling inputs for one step, built by the runner from the requests' params."""

    temperature: Tensor  # [B] float32; 0 selects greedy
    top_k: Tensor  # [B] int64; <= 0 disables
    top_p: Tensor  # [B] float32; 1 disables
    min_p: Tensor  # [B] float32; 0 disables
    seeds: Tensor  # [B] int64
    positions: Tensor  # [B] int64, absolute position of the token being sampled
    presence_penalty: Tensor | None = None  # [B]
    frequency_penalty: Tensor | None = None  # [B]
    repetition_penalty: Tensor | None = None  # [B]
    output_counts: Tensor | None = None  # [B, V] how often each token was generated so far
    prompt_mask: Tensor | None = None  # [B, V] bool, token occurs in the prompt
    allowed: Tensor | None = None  # [B, V] bool; False bans a token (grammar, min_tokens)
    logit_bias: Tensor | None = None  # [B, V] float32 added to the logits first
    #: Rows with temperature > 0 and whether any of them has top-k or top-p on, when the host
    #: knows them (the engine's runner does): finding them on the device would be a sync, which
    #: stalls an asynchronous engine until the step's forward has finished. None: found here.
    sampled_rows: Tensor | None = None
    any_top_k_top_p: bool | None = None


@dataclass
class SamplerOutput:
    token_ids: Tensor  # [B] int64
    logprobs: Tensor  # [B] float32, of the sampled token under the model's raw distribution
    top_ids: Tensor | None = None  # [B, n]
    top_logprobs: Tensor | None = None  # [B, n]


def apply_penalties(logits: Tensor, t: SamplingTensors) -> Tensor:
    """OpenAI presence/frequency penalties on generated tokens; repetition on prompt + output."""
    if t.output_counts is None:
        return logits
    counts = t.output_counts.to(logits.dtype)
    if t.repetition_penalty is not None:
        seen = counts > 0
        if t.prompt_mask is not None:
            seen = seen | t.prompt_mask
        r = t.repetition_penalty[:, None].to(logits.dtype)
        penalised = torch.where(logits > 0, logits / r, logits * r)
        logits = torch.where(seen, penalised, logits)
    if t.frequency_penalty is not None:
        logits = logits - t.frequency_penalty[:, None] * counts
    if t.presence_penalty is not None:
        logits = logits - t.presence_penalty[:, None] * (counts > 0).to(logits.dtype)
    return logits


def processed_logits(raw: Tensor, t: SamplingTensors) -> Tensor:
    """The logits a row is drawn from, before temperature and filters: logit bias, then
    penalties, then the allowed mask (banned tokens at -inf). One definition, so speculative
    verification processes each drafted position exactly as a draw there would."""
    x = apply_penalties(raw if t.logit_bias is None else raw + t.logit_bias, t)
    if t.allowed is not None:
        x = x.masked_fill(~t.allowed, float("-inf"))
    return x


def filter_mask(
    probs: Tensor, top_k: Tensor, top_p: Tensor, min_p: Tensor, sort: bool | None = None
) -> Tensor:
    """Boolean keep-mask ``[B, V]`` for min-p, then top-k, then top-p (see module docstring).
    ``sort``: whether any row has top-k or top-p on (None: checked here, a device sync)."""
    keep = probs >= min_p[:, None] * probs.max(dim=-1, keepdim=True).values
    if sort is None:
        sort = bool((top_k > 0).any()) or bool((top_p < 1).any())
    if sort:
        # Stable sort on descending probability: equal values keep token-id order.
        order = torch.sort(-probs, dim=-1, stable=True).indices
        sorted_p = torch.gather(probs * keep, -1, order)
        ranks = torch.arange(probs.shape[-1], device=probs.device)[None, :]
        k = torch.where(top_k > 0, top_k, probs.shape[-1])[:, None]
        sorted_keep = (ranks < k) & (sorted_p > 0)
        sorted_p = sorted_p * sorted_keep
        mass = sorted_p.sum(dim=-1, keepdim=True)
        before = (torch.cumsum(sorted_p, dim=-1) - sorted_p) / mass
        # top_p == 1 must keep everything even where float32 rounds the mass before the tail to 1.
        sorted_keep &= (before < top_p[:, None]) | (top_p[:, None] >= 1)
        sorted_keep[:, 0] = True
        keep = torch.zeros_like(keep).scatter_(-1, order, sorted_keep)
    keep.scatter_(-1, probs.argmax(dim=-1, keepdim=True), True)  # a scalar fill: no upload
    return keep


def greedy(logits: Tensor) -> SamplerOutput:
    """:func:`sample`'s draws and logprobs where every row is greedy and nothing processes
    the logits: the argmax, in a few kernels and without the sampler's inputs (which a
    verification step would otherwise build on the host for every position)."""
    raw = logits.float()
    token_ids = torch.argmax(raw, dim=-1)
    logp = torch.log_softmax(raw, dim=-1)
    return SamplerOutput(token_ids, logp.gather(-1, token_ids[:, None]).squeeze(-1))


def sample(
    logits: Tensor, t: SamplingTensors, num_logprobs: int = 0, ops: Backend | None = None
) -> SamplerOutput:
    """Pick one token per row of ``logits`` ``[B, V]``; ``ops`` supplies the noise (a kernel
    backend's fused RNG), by default the reference's tensor ops, which give the same bits."""
    raw = logits.float()
    x = processed_logits(raw, t)
    token_ids = torch.argmax(x, dim=-1)
    rows = t.sampled_rows
    if rows is None:
        rows = torch.nonzero(t.temperature > 0).squeeze(-1)
    if rows.numel():  # greedy rows need neither filters nor noise
        scaled = x[rows] / t.temperature[rows, None]
        keep = filter_mask(
            torch.softmax(scaled, dim=-1),
            t.top_k[rows],
            t.top_p[rows],
            t.min_p[rows],
            t.any_top_k_top_p,
        )
        if t.allowed is not None:
            keep &= t.allowed[rows]
        draw = ops.sampling_uniform if ops is not None else rng.sampling_uniform
        noise = rng.gumbel(draw(t.seeds[rows], t.positions[rows], x.shape[-1]))
        drawn = torch.argmax(torch.where(keep, scaled + noise, float("-inf")), dim=-1)
        token_ids[rows] = drawn

    logp = torch.log_softmax(raw, dim=-1)
    out = SamplerOutput(token_ids, logp.gather(-1, token_ids[:, None]).squeeze(-1))
    if num_logprobs > 0:
        order = torch.sort(-logp, dim=-1, stable=True).indices[:, :num_logprobs]
        out.top_ids = order
        out.top_logprobs = logp.gather(-1, order)
    return out
