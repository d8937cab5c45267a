"""Each row's sampling inputs: what the sampler needs to know of a request at one position.

A row is a request as it stands (the runner's draws), or as it would stand had some drafted
tokens been emitted (speculative verification, :mod:`.spec_sampling`): its output tokens with
the drafts (penalties, bad words), their count (``min_tokens``), the position drawn at, and the
grammar's mask there. Both build their :class:`~deepinfer.sampling.SamplingTensors` here, so a
drafted position is processed by the very rules a draw at that position follows.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from deepinfer.engine.request import Request
from deepinfer.sampling import SamplingTensors
from deepinfer.sampling_params import SamplingParams
from deepinfer.transfer import rows_to_device, to_device


@dataclass(frozen=True)
class SamplingRow:
    """One row of a draw: a request at one position."""

    params: SamplingParams
    seed: int
    #: Absolute position of the token drawn.
    position: int
    prompt_token_ids: Sequence[int]
    #: The generated tokens the host knows (a token in flight is not among them).
    output_token_ids: Sequence[int]
    #: Generated tokens so far, one in flight included (``min_tokens`` counts it).
    num_output_tokens: int
    bad_words: Sequence[Sequence[int]]
    #: Bool [V]: the tokens the grammar accepts here; None without a grammar.
    grammar: Tensor | None

    @classmethod
    def of(
        cls, req: Request, drafts: Sequence[int] = (), grammar: Tensor | None = None
    ) -> SamplingRow:
        """``req``'s row as it stands, or as it would stand after ``drafts`` were emitted;
        ``grammar``: the grammar's mask at that position (None: no grammar)."""
        outputs = [*req.output_token_ids, *drafts] if drafts else req.output_token_ids
        return cls(
            req.params,
            req.seed,
            req.num_tokens + len(drafts),
            req.prompt_token_ids,
            outputs,
            req.num_output_tokens + len(drafts),
            req.bad_words,
            grammar,
        )


def banned_tokens(row: SamplingRow, eos_token_ids: Collection[int], vocab_size: int) -> set[int]:
    """Stop tokens until ``min_tokens`` tokens have been generated, and the last token of
    each bad word whose other tokens end the output so far."""
    banned: set[int] = set()
    if row.num_output_tokens < row.params.min_tokens:
        banned |= set(row.params.stop_token_ids)
        if not row.params.ignore_eos:
            banned |= set(eos_token_ids)
    out = row.output_token_ids
    for seq in row.bad_words:
        *head, last = seq
        if not head or (len(out) >= len(head) and list(out[len(out) - len(head) :]) == head):
            banned.add(last)
    return {t for t in banned if t < vocab_size}


def plain_draws(reqs: Sequence[Request]) -> bool:
    """Whether :func:`sampling_tensors` would give none of ``reqs``' next draws anything that
    changes its logits before temperature and the filters (a bias, a penalty, a ban, an
    allowed list, a grammar; conservative: ``min_tokens`` counts while it lasts, whether or
    not it bans a token there), so :func:`position_tensors` builds their inputs without a row
    each (the common case)."""
    for r in reqs:
        p = r.params
        if (
            p.penalized
            or p.logit_bias
            or p.allowed_token_ids
            or r.bad_words
            or r.grammar is not None
            or r.num_output_tokens < p.min_tokens
        ):
            return False
    return True


def sampling_tensors(
    rows: Sequence[SamplingRow],
    vocab_size: int,
    eos_token_ids: Collection[int],
    device: torch.device,
) -> SamplingTensors:
    """The sampler's inputs for ``rows``, one tensor row each."""

    def col(values: list[float] | list[int], dtype: torch.dtype) -> Tensor:
        return to_device(torch.tensor(values, dtype=dtype), device)

    ps = [r.params for r in rows]
    floats = [[p.temperature for p in ps], [p.top_p for p in ps], [p.min_p for p in ps]]
    ints = [[max(p.top_k, 0) for p in ps], [r.seed for r in rows], [r.position for r in rows]]
    temperature, top_p, min_p = _block(floats, torch.float32, device)
    top_k, seeds, positions = _block(ints, torch.int64, device)
    t = SamplingTensors(
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        min_p=min_p,
        seeds=seeds,
        positions=positions,
        sampled_rows=col([i for i, p in enumerate(ps) if p.temperature > 0], torch.int64),
        any_top_k_top_p=any(p.temperature > 0 and (p.top_k > 0 or p.top_p < 1) for p in ps),
    )
    if any(p.penalized for p in ps):
        counts = torch.zeros(len(rows), vocab_size, dtype=torch.int64, device=device)
        prompt = torch.zeros(len(rows), vocab_size, dtype=torch.bool, device=device)
        for i, r in enumerate(rows):
            if r.output_token_ids:
                counts[i] = torch.bincount(
                    col(list(r.output_token_ids), torch.int64), minlength=vocab_size
                )
            prompt[i, col(list(r.prompt_token_ids), torch.int64)] = True
        t.output_counts, t.prompt_mask = counts, prompt
        t.presence_penalty = col([p.presence_penalty for p in ps], torch.float32)
        t.frequency_penalty = col([p.frequency_penalty for p in ps], torch.float32)
        t.repetition_penalty = col([p.repetition_penalty for p in ps], torch.float32)
    if any(p.logit_bias for p in ps):
        bias = torch.zeros(len(rows), vocab_size, dtype=torch.float32)
        for i, p in enumerate(ps):
            if p.logit_bias:
                bias[i, list(p.logit_bias)] = torch.tensor(
                    list(p.logit_bias.values()), dtype=torch.float32
                )
        t.logit_bias = to_device(bias, device)
    t.allowed = _allowed(rows, vocab_size, eos_token_ids, device)
    return t


def position_tensors(
    reqs: Sequence[Request], counts: Sequence[int], device: torch.device
) -> SamplingTensors:
    """The sampler's inputs for ``counts[i]`` consecutive positions of each request (a
    verification row's: from the request's next position on), built column by column
    without a :class:`SamplingRow` per position. Only for requests whose draws are
    :func:`plain_draws`: they need nothing but temperature, the filters and the noise."""
    ps = [r.params for r in reqs]
    floats = [[p.temperature for p in ps], [p.top_p for p in ps], [p.min_p for p in ps]]
    ints = [[max(p.top_k, 0) for p in ps], [r.seed for r in reqs], [r.num_tokens for r in reqs]]
    float_cols, int_cols = torch.tensor(floats), torch.tensor(ints, dtype=torch.int64)
    if any(c != 1 for c in counts):  # each request's columns repeated over its positions
        n = torch.tensor(counts, dtype=torch.int64)
        float_cols, int_cols = float_cols.repeat_interleave(n, 1), int_cols.repeat_interleave(n, 1)
        first = torch.cumsum(n, 0) - n  # each request's first row
        int_cols[2] += torch.arange(int(n.sum())) - first.repeat_interleave(n)
    temperature = float_cols[0]
    temp, top_p, min_p = rows_to_device(list(float_cols), device)
    top_k, seeds, positions = rows_to_device(list(int_cols), device)
    return SamplingTensors(
        temperature=temp,
        top_k=top_k,
        top_p=top_p,
        min_p=min_p,
        seeds=seeds,
        positions=positions,
        sampled_rows=to_device(torch.nonzero(temperature > 0).squeeze(-1), device),
        any_top_k_top_p=any(p.temperature > 0 and (p.top_k > 0 or p.top_p < 1) for p in ps),
    )


def _block(
    columns: list[list[float]] | list[list[int]], dtype: torch.dtype, device: torch.device
) -> list[Tensor]:
    """Columns of one dtype on ``device`` through one copy (:func:`.transfer.rows_to_device`)."""
    return rows_to_device(list(torch.tensor(columns, dtype=dtype)), device)


def _allowed(
    rows: Sequence[SamplingRow],
    vocab_size: int,
    eos_token_ids: Collection[int],
    device: torch.device,
) -> Tensor | None:
    """[B, V] bool: the tokens each row may draw (None: every token, in every row)."""
    banned = [banned_tokens(r, eos_token_ids, vocab_size) for r in rows]
    only = [r.params.allowed_token_ids for r in rows]
    if not (any(banned) or any(only) or any(r.grammar is not None for r in rows)):
        return None
    allowed = torch.ones(len(rows), vocab_size, dtype=torch.bool, device=device)
    for i, (row, ids) in enumerate(zip(rows, banned, strict=True)):
        if only[i]:
            allowed[i] = False
            allowed[i, to_device(torch.tensor(only[i], dtype=torch.int64), device)] = True
        # Bans (min_tokens' stop tokens, bad words) yield when nothing else is allowed.
        if ids and not (only[i] and ids.issuperset(only[i])):
            allowed[i, to_device(torch.tensor(sorted(ids), dtype=torch.int64), device)] = False
        if row.grammar is not None:
            grammar = row.grammar.to(device)
            # The grammar wins when it allows nothing but a banned stop token.
            both = grammar & allowed[i]
            allowed[i] = both if bool(both.any()) else grammar
    return allowed
