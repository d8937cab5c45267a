"""The batch description of one model step, and what the step hands back.

A step feeds each scheduled sequence a *span* of tokens: a prefill chunk, one decode token, or
the k tokens of a speculative verification row. The runner describes the whole step once, as an
immutable :class:`ForwardBatch`, and calls ``model(batch)``; the model picks how to run the spans
(over the shared slot rows, one decode pass for single-token rows only, one ragged pass for any
other mix; spans of states with their own tensors one after the other) and advances each span's
state. Nothing else in the model is an entry point for inference.

Positions are explicit: a span starts where its state stands when the batch is built
(``start``), and the model refuses a batch whose states have moved since, so a stale or doubly
applied description fails loudly instead of corrupting a sequence.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
from torch import Tensor

from deepinfer.models.state import ModelState

#: ``tuple.__new__``: builds a span without the generated constructor's Python frame.
_new_tuple: Callable[..., Any] = tuple.__new__


class SequenceSpan(NamedTuple):
    """One sequence's tokens in a step: ``num_tokens`` per row, ``rows`` rows (the state's
    batch size: more than one for a lockstep batch of sequences at one position, which runs in
    a batch of its own), continuing ``state`` from position ``start``. Build one with
    :meth:`new`, which checks it.

    The logits of the last ``num_logits`` positions of each row are kept (1: the next token's;
    ``num_tokens``: every position's, for verification or prompt logprobs; 0: none, a chunk in
    the middle of a prompt). ``record_at``: lengths strictly inside the span at which the step
    also returns the state as it stood there (the prefix cache's block ends).

    A tuple, not a frozen dataclass: a decode step builds one per running request, and a tuple
    costs a third as much to make.
    """

    state: ModelState
    num_tokens: int
    num_logits: int
    record_at: tuple[int, ...]
    start: int
    rows: int

    @classmethod
    def new(
        cls,
        state: ModelState,
        num_tokens: int,
        num_logits: int = 1,
        record_at: tuple[int, ...] = (),
    ) -> SequenceSpan:
        """A checked span continuing ``state`` from where it stands now."""
        if num_tokens < 1:
            raise ValueError(f"a span needs at least one token, got {num_tokens}")
        if not 0 <= num_logits <= num_tokens:
            raise ValueError(f"num_logits {num_logits} outside 0..{num_tokens}")
        start = state.pos
        if record_at and any(not start < m < start + num_tokens for m in record_at):
            raise ValueError(f"record_at {record_at} not inside ({start}, {start + num_tokens})")
        return cls(state, num_tokens, num_logits, record_at, start, state.batch_size)

    @classmethod
    def decode_row(cls, state: ModelState) -> SequenceSpan:
        """One next token for ``state`` (the hot path of every decode step: nothing to check
        beyond what the batch checks)."""
        return _new_tuple(cls, (state, 1, 1, (), state.pos, state.batch_size))

    @property
    def size(self) -> int:
        """Its ids in the batch's flat ``input_ids``."""
        return self.rows * self.num_tokens

    @property
    def is_decode(self) -> bool:
        """One token of one sequence with its logits and nothing to record."""
        return self.rows == self.num_tokens == self.num_logits == 1 and not self.record_at


@dataclass(frozen=True)
class ForwardBatch:
    """Every span of one step (see the module).

    ``input_ids`` [N] (host or device; a decode row's token may still be on the device, where
    the previous step drew it) holds the spans' ids one after the other, a lockstep span's row
    by row. ``image_embeds`` [n, d]: V4.1's aligned image embeddings, one per image token, in a
    batch of a single span; ``return_streams``: also return the final residual streams at
    every position, whatever logits are kept (an MTP layer reads the target's streams at every
    position it drafts from). ``offsets``, ``num_tokens`` and ``decode_rows``
    (the spans that are single decode tokens) are derived once, at construction.
    """

    input_ids: Tensor
    spans: tuple[SequenceSpan, ...]
    image_embeds: Tensor | None = None
    return_streams: bool = False
    offsets: tuple[int, ...] = field(init=False)
    num_tokens: int = field(init=False)
    decode_rows: tuple[int, ...] = field(init=False)

    def __post_init__(self) -> None:
        spans = self.spans
        if not spans:
            raise ValueError("a forward batch needs at least one span")
        # Built every step, one span per running request: columns first, then C-level sums.
        sizes = [s.rows * s.num_tokens for s in spans]
        at = sum(sizes)
        if at != len(spans) and len(spans) > 1 and any(s.rows > 1 for s in spans):
            raise ValueError("a lockstep state (batch_size > 1) runs in a batch of its own")
        if self.input_ids.dim() != 1 or self.input_ids.numel() != at:
            raise ValueError(
                f"input_ids must be [{at}] (the spans' tokens), got {tuple(self.input_ids.shape)}"
            )
        if self.image_embeds is not None and len(spans) != 1:
            raise ValueError("image embeddings go with a batch of a single span")
        if len({id(s.state) for s in spans}) != len(spans):
            raise ValueError("a state appears in two spans of one batch")
        if at == len(spans):  # one token each: decode rows, unless they keep no logits or record
            decode = tuple(i for i, s in enumerate(spans) if s.num_logits == 1 and not s.record_at)
        else:
            decode = tuple(i for i, s in enumerate(spans) if s.is_decode)
        object.__setattr__(self, "offsets", tuple(itertools.accumulate(sizes, initial=0))[:-1])
        object.__setattr__(self, "num_tokens", at)
        object.__setattr__(self, "decode_rows", decode)

    @classmethod
    def of(
        cls,
        input_ids: Tensor,
        state: ModelState,
        *,
        num_logits: int | None = None,
        image_embeds: Tensor | None = None,
        return_streams: bool = False,
    ) -> ForwardBatch:
        """One span: ``input_ids`` [B, S] (or [S]) continuing ``state``, every position's
        logits unless ``num_logits`` says otherwise."""
        ids = input_ids if input_ids.dim() == 2 else input_ids.reshape(1, -1)
        if ids.dim() != 2 or ids.shape[0] != state.batch_size:
            raise ValueError(
                f"input_ids must be [batch, seq] with batch {state.batch_size} (the state's), "
                f"got shape {tuple(input_ids.shape)}"
            )
        n = ids.shape[1] if num_logits is None else num_logits
        span = SequenceSpan.new(state, ids.shape[1], n)
        return cls(ids.reshape(-1), (span,), image_embeds, return_streams)

    @classmethod
    def build(
        cls,
        chunks: Sequence[Tensor],
        states: Sequence[ModelState],
        num_logits: Sequence[int] | None = None,
        record_at: Sequence[Sequence[int]] | None = None,
        return_streams: bool = False,
    ) -> ForwardBatch:
        """Spans of single sequences: ``chunks[i]`` (any shape, read flat) continues
        ``states[i]``; by default each keeps its last logits."""
        if len(chunks) != len(states):
            raise ValueError(f"{len(chunks)} chunks for {len(states)} states")
        keep = [1] * len(chunks) if num_logits is None else list(num_logits)
        marks = [()] * len(chunks) if record_at is None else [tuple(m) for m in record_at]
        spans = tuple(
            SequenceSpan.new(s, c.numel(), n, m)
            for c, s, n, m in zip(chunks, states, keep, marks, strict=True)
        )
        ids = torch.cat([c.reshape(-1) for c in chunks]) if chunks else torch.empty(0)
        return cls(ids, spans, return_streams=return_streams)

    @classmethod
    def decode(cls, input_ids: Tensor, states: Sequence[ModelState]) -> ForwardBatch:
        """One token per single-sequence state: ``input_ids`` [B].

        Built every step for every running request, so the derived fields are written here
        directly: what ``__post_init__`` would check holds by construction, but for lockstep
        states and repeated states, which go through the checked path to be refused there.
        """
        spans = tuple(map(SequenceSpan.decode_row, states))
        ids = input_ids.reshape(-1)
        n = len(spans)
        single = all(s.batch_size == 1 for s in states)
        if not single or ids.numel() != n or len({id(s) for s in states}) != n:
            return cls(ids, spans)
        batch = object.__new__(cls)
        every = tuple(range(n))
        for name, value in (
            ("input_ids", ids),
            ("spans", spans),
            ("image_embeds", None),
            ("return_streams", False),
            ("offsets", every),
            ("num_tokens", n),
            ("decode_rows", every),
        ):
            object.__setattr__(batch, name, value)
        return batch

    def span_ids(self, i: int) -> Tensor:
        """Span ``i``'s ids [rows, num_tokens]."""
        span, at = self.spans[i], self.offsets[i]
        return self.input_ids[at : at + span.size].view(span.rows, span.num_tokens)

    def check_fresh(self) -> None:
        """Refuse a batch whose states moved since it was built."""
        for i, span in enumerate(self.spans):
            if span.state.pos != span.start:
                raise ValueError(
                    f"span {i} was built at position {span.start} but its state is at "
                    f"{span.state.pos}: a forward batch runs once"
                )


@dataclass
class ForwardOutput:
    """What a step hands back, in span order."""

    #: [sum over spans of rows * num_logits, V] fp32: each row's kept positions, in order.
    logits: Tensor
    #: Per span, one state per ``record_at`` length: read-only views for the prefix cache.
    states_at: list[Sequence[ModelState]]
    #: [num_tokens, hc_mult, d] the final residual streams at every position, in span order
    #: (``return_streams``), else None.
    streams: Tensor | None = None
    #: [num_tokens, F] the outputs of the layers the step was asked to ``capture`` at every
    #: position, concatenated per token, in span order (DSpark's context), else None.
    features: Tensor | None = None

    def split(self, batch: ForwardBatch) -> list[Tensor]:
        """The logits per span: [rows * num_logits, V] each."""
        sizes = [s.rows * s.num_logits for s in batch.spans]
        return list(torch.split(self.logits, sizes))
