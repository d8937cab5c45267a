"""A verification row's positions, each drawn as the sampler would draw there.

Row j of a verification holds the target's logits after the request's last token and
``drafts[:j]``: the position the request would be at had ``drafts[:j]`` been emitted. Its
sampling inputs are the request's as they would then stand (:class:`~.sampling_rows.SamplingRow`:
penalties and bad words over the output with ``drafts[:j]``, ``min_tokens`` by that output's
length, the grammar's mask after ``drafts[:j]``, the seed and the position), and the sampler
itself (:func:`~deepinfer.sampling.sampler.sample`, the same noise at the same position) draws
the token at every row. Drafts are deterministic (the drafters' argmax), so verification is
exact matching: a draft is kept while it equals the sampler's draw at its position, and the
first draw that differs (or the one after the last draft) is the next token. Each emitted token
is thus the very token the sampler draws at its position without speculation, given the same
logits: lossless (a draft is kept with the probability the sampler gives it, and on a mismatch
the draw is distributed as the target's residual), and a seeded request emits the same tokens
with or without speculation, in any batch and whatever number of drafts a schedule verifies.

Which drafts are verified: a prefix of those offered. A draft that ends the request (a stop
token) and everything after it is left out: the token drawn after the kept drafts comes from
the same distribution, so the tokens emitted are the same, and the grammar is never asked past
its end. A structured request's drafts end before the first one its grammar rejects
(``draft_masks``, which leaves the matcher where it was: the engine advances it by the tokens
it takes in). Logprobs are the raw model's, as the sampler reports them.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from deepinfer.backends.base import Backend
from deepinfer.engine.request import Request
from deepinfer.engine.runner import logprob_entry
from deepinfer.engine.sampling_rows import (
    SamplingRow,
    plain_draws,
    position_tensors,
    sampling_tensors,
)
from deepinfer.sampling.sampler import greedy, sample


@dataclass(frozen=True)
class PositionTargets:
    """What a request's verification row (or first token) is sampled from."""

    #: The drafts verified: a prefix of those offered.
    drafts: list[int]
    #: [len(drafts) + 1] the sampler's draw at each position.
    tokens: list[int]
    #: [len(drafts) + 1] each draw's logprob under the raw model (as the sampler reports it).
    token_logprobs: list[float]
    #: [len(drafts) + 1, V] the logits drawn from, before processing; their log-softmax is
    #: the raw model's distribution, read only for a request that reports top logprobs.
    raw: Tensor

    def kept(self) -> int:
        """How many drafts pass: those before the first that differs from the draw there."""
        return next((j for j, d in enumerate(self.drafts) if d != self.tokens[j]), len(self.drafts))

    def emit(self, req: Request, n: int) -> list[tuple[int, float]]:
        """The first ``n`` draws with their logprobs, as a step hands them over; a request
        that reports logprobs gets their entries (with the top alternatives) queued for the
        engine to take in with each token (``Request.spec_logprobs``)."""
        tokens = self.tokens[:n]
        if req.params.logprobs is not None:
            k = req.params.logprobs
            logp = torch.log_softmax(self.raw[:n], dim=-1)
            req.spec_logprobs = [logprob_entry(logp[j], t, k) for j, t in enumerate(tokens)]
        return list(zip(tokens, self.token_logprobs[:n], strict=True))


def eos_ids(eos: int | list[int] | None) -> set[int]:
    """The end-of-sequence ids of a model config's ``eos_token_id`` (as the engine reads it)."""
    return set(eos if isinstance(eos, list) else [] if eos is None else [eos])


def verified_drafts(
    req: Request, offered: Sequence[int], eos_token_ids: Collection[int]
) -> tuple[list[int], Tensor | None]:
    """The drafts worth verifying (see the module) and, for a structured request, the
    grammar's masks [len(drafts) + 1, V] at their positions."""
    params = req.params
    stops = set(params.stop_token_ids)
    if not params.ignore_eos or req.grammar is not None:  # a grammar ends at its stop token
        stops |= set(eos_token_ids)
    drafts = list(offered)
    cut = next((i for i, t in enumerate(drafts) if t in stops), len(drafts))
    drafts = drafts[:cut]
    if req.grammar is None:
        return drafts, None
    masks, accepted = req.grammar.draft_masks(drafts)
    return drafts[:accepted], masks


#: On a CPU, the sampler's calls of a step take at most this many bytes of logits each: its
#: passes over [rows, V] then stay in cache, and no large buffer is allocated per pass.
CPU_BLOCK_BYTES = 2 << 20


def step_targets(  # noqa: PLR0917
    reqs: Sequence[Request],
    offered: Sequence[Sequence[int]],
    logits: Sequence[Tensor],
    eos_token_ids: Collection[int],
    image_token_id: int | None = None,
    ops: Backend | None = None,
) -> list[PositionTargets]:
    """The sampler's draws at every position of a step's rows: for request i, from
    ``logits[i]`` [len(offered[i]) + 1, V] (row j: after ``offered[i][:j]``); ``ops``: the
    backend whose noise the engine's sampler uses. One call of the sampler for the whole step
    on an accelerator (on a CPU, one per block of requests of at most
    :data:`CPU_BLOCK_BYTES` of logits). The sampler is row-wise, so each draw is the one the
    request alone would get, however the rows are grouped."""
    verified = [verified_drafts(r, o, eos_token_ids) for r, o in zip(reqs, offered, strict=True)]
    targets: list[PositionTargets] = []
    lo = 0
    while lo < len(reqs):
        hi = _block_end(verified, logits, lo)
        block = zip(reqs[lo:hi], verified[lo:hi], logits[lo:hi], strict=True)
        targets += _draw(list(block), eos_token_ids, image_token_id, ops)
        lo = hi
    return targets


def _block_end(
    verified: Sequence[tuple[list[int], Tensor | None]], logits: Sequence[Tensor], lo: int
) -> int:
    """Where the block of requests that starts at ``lo`` ends (see :data:`CPU_BLOCK_BYTES`)."""
    if logits[lo].device.type != "cpu":
        return len(logits)
    budget = max(1, CPU_BLOCK_BYTES // (4 * logits[lo].shape[-1]))  # rows, as float32
    hi, rows = lo, 0
    while hi < len(logits) and (hi == lo or rows + len(verified[hi][0]) + 1 <= budget):
        rows += len(verified[hi][0]) + 1
        hi += 1
    return hi


def _draw(
    block: Sequence[tuple[Request, tuple[list[int], Tensor | None], Tensor]],
    eos_token_ids: Collection[int],
    image_token_id: int | None,
    ops: Backend | None,
) -> list[PositionTargets]:
    """One call of the sampler for a block of (request, (drafts, grammar masks), logits)."""
    reqs = [req for req, _, _ in block]
    counts = [len(drafts) + 1 for _, (drafts, _), _ in block]
    raw = torch.cat([x[:c] for (_, _, x), c in zip(block, counts, strict=True)]).float()
    if image_token_id is not None and image_token_id < raw.shape[-1]:
        # Never drawn, as in the runner: a generated image placeholder could not be fed back.
        # (a column by index: a token id uploaded here would make the host wait for the pass)
        raw[:, image_token_id] = float("-inf")
    if not plain_draws(reqs):
        rows = [
            SamplingRow.of(req, drafts[:j], None if masks is None else masks[j])
            for req, (drafts, masks), _ in block
            for j in range(len(drafts) + 1)
        ]
        out = sample(raw, sampling_tensors(rows, raw.shape[-1], eos_token_ids, raw.device), ops=ops)
    elif all(req.params.temperature == 0 for req in reqs):
        out = greedy(raw)  # what sample draws for greedy rows, without building its inputs
    else:  # the common case: nothing but temperature and filters, built without rows
        out = sample(raw, position_tensors(reqs, counts, raw.device), ops=ops)
    tokens, logprobs = out.token_ids.tolist(), out.logprobs.tolist()
    targets, at = [], 0
    for (_, (drafts, _), _), n in zip(block, counts, strict=True):
        end = at + n
        targets.append(PositionTargets(drafts, tokens[at:end], logprobs[at:end], raw[at:end]))
        at = end
    return targets
