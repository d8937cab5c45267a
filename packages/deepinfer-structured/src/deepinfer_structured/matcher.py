"""Per-sequence matchers: one over xgrammar's matcher, one that leaves the reasoning free.

xgrammar reports the allowed tokens as an int32 bitmask; :meth:`XGrammarMatcher.allowed`
unpacks it into the bool mask the engine's sampler takes, and :meth:`fill_bitmask` writes the
packed words straight into a caller's batch bitmask for samplers that apply bitmasks directly.
Both intersect the grammar's tokens with the :class:`~deepinfer_structured.utf8.Utf8Guard`'s,
so the output is valid UTF-8 and decodes to the text the grammar checked.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch
from torch import Tensor

from deepinfer.errors import InvalidRequestError
from deepinfer.sampling_params import StructuredOutputsParams
from deepinfer.structured import ReplyConstraint
from deepinfer_structured.bits import pack_bitmask, unpack_words
from deepinfer_structured.utf8 import INVALID, Utf8Guard


class Matcher(Protocol):
    """The matcher interface the engine uses (``deepinfer.structured.GrammarMatcher``)."""

    vocab_size: int

    def allowed(self) -> Tensor: ...
    def fill_bitmask(self, bitmask: Tensor, row: int) -> None: ...
    def accept(self, token_id: int) -> bool: ...
    def rollback(self, num_tokens: int) -> None: ...
    def is_terminated(self) -> bool: ...


def draft_masks(matcher: Matcher, draft: list[int]) -> tuple[Tensor, int]:
    """Masks for verifying ``draft``: one per draft position plus the bonus position, cut at the
    first token the grammar rejects; the matcher is rolled back to where it started."""
    masks = torch.zeros(len(draft) + 1, matcher.vocab_size, dtype=torch.bool)
    accepted = 0
    for i, token in enumerate(draft):
        masks[i] = matcher.allowed()
        if not masks[i, token] or not matcher.accept(token):
            break
        accepted += 1
    else:
        masks[len(draft)] = matcher.allowed()
    matcher.rollback(accepted)
    return masks[: accepted + 1], accepted


class XGrammarMatcher:
    """One sequence's position in a compiled xgrammar grammar (and in the current character).

    Where the grammar leaves no valid UTF-8 continuation (a pattern that demands surrogates),
    the grammar's mask is used alone and the character tracking restarts after the token.
    """

    def __init__(
        self, xgr: Any, compiled: Any, vocab_size: int, guard: Utf8Guard | None = None
    ) -> None:
        self._m = xgr.GrammarMatcher(compiled)
        self.vocab_size = vocab_size
        self._bitmask = xgr.allocate_token_bitmask(1, vocab_size)
        self._words = self._bitmask[0].numpy()  # shares memory: xgrammar fills, numpy reads
        self._guard = guard
        self._utf8 = [0]  # decoder state after each accepted token (for rollback)

    def allowed(self) -> Tensor:
        self._m.fill_next_token_bitmask(self._bitmask)
        words = self._words
        if self._guard is not None:
            both = words & self._guard.packed_words(self._utf8[-1])
            if both.any():
                words = both
        return unpack_words(words, self.vocab_size)

    def fill_bitmask(self, bitmask: Tensor, row: int) -> None:
        self._m.fill_next_token_bitmask(bitmask, row)
        if self._guard is not None:
            words = bitmask[row].numpy()  # a CPU bitmask, as xgrammar fills
            both = words & self._guard.packed_words(self._utf8[-1])
            if both.any():
                words[:] = both

    def accept(self, token_id: int) -> bool:
        if not self._m.accept_token(token_id):
            return False
        if self._guard is not None:
            state = self._guard.advance(self._utf8[-1], token_id)
            self._utf8.append(0 if state == INVALID else state)
        return True

    def rollback(self, num_tokens: int) -> None:
        if num_tokens:
            self._m.rollback(num_tokens)
            if self._guard is not None:
                del self._utf8[-num_tokens:]

    def is_terminated(self) -> bool:
        return bool(self._m.is_terminated())

    def draft_masks(self, draft: list[int]) -> tuple[Tensor, int]:
        return draft_masks(self, draft)


class ReasoningMatcher:
    """Free reasoning until the end-of-reasoning token, then the inner grammar.

    The chat parser ends the reasoning at the ``</think>`` *token* (the same text spelled from
    ordinary tokens stays reasoning), so the switch is on that token id. Until then every token
    but a stop token is allowed: a reply that stopped inside its reasoning would have no answer
    to satisfy the constraint. ``budget`` caps the reasoning: once that many tokens are spent
    only the end token is allowed. ``inner`` None leaves the answer free as well (a reasoning
    budget with no constraint). Rollback crosses the switch: undoing the end token reopens the
    reasoning.
    """

    def __init__(
        self,
        inner: Matcher | None,
        end_token_id: int,
        stop_token_ids: list[int],
        vocab_size: int,
        budget: int | None = None,
    ) -> None:
        self._inner = inner
        self._end = end_token_id
        self._stops = frozenset(stop_token_ids)
        self._budget = budget
        self.vocab_size = vocab_size
        self._free_mask = torch.ones(vocab_size, dtype=torch.bool)
        self._free_mask[[t for t in stop_token_ids if t < vocab_size]] = False
        self._end_only = torch.zeros(vocab_size, dtype=torch.bool)
        self._end_only[end_token_id] = True
        self._words: dict[int, Tensor] = {}  # packed free / end-only masks per bitmask width
        self._reasoning = 0  # tokens accepted before the end token
        self._ended = False
        self._answer = 0  # tokens accepted after it

    def _budget_spent(self) -> bool:
        return self._budget is not None and self._reasoning >= self._budget

    def allowed(self) -> Tensor:
        if self._ended:
            if self._inner is None:
                return torch.ones(self.vocab_size, dtype=torch.bool)
            return self._inner.allowed()
        return (self._end_only if self._budget_spent() else self._free_mask).clone()

    def fill_bitmask(self, bitmask: Tensor, row: int) -> None:
        if self._ended and self._inner is not None:
            self._inner.fill_bitmask(bitmask, row)
            return
        words = self._words.get(bitmask.shape[1])
        if words is None:
            words = self._words[bitmask.shape[1]] = torch.stack(
                [pack_bitmask(m, bitmask.shape[1]) for m in (self._free_mask, self._end_only)]
            )
        if self._ended:  # no inner grammar: the answer is free
            bitmask[row] = pack_bitmask(
                torch.ones(self.vocab_size, dtype=torch.bool), words.shape[1]
            )
        else:
            bitmask[row] = words[1 if self._budget_spent() else 0]

    def accept(self, token_id: int) -> bool:
        if self._ended:
            if self._inner is None:
                self._answer += 1
                return True
            ok = self._inner.accept(token_id)
            self._answer += int(ok)
            return ok
        if token_id in self._stops or (self._budget_spent() and token_id != self._end):
            return False
        if token_id == self._end:
            self._ended = True
        else:
            self._reasoning += 1
        return True

    def rollback(self, num_tokens: int) -> None:
        undo_answer = min(num_tokens, self._answer)
        if undo_answer and self._inner is not None:
            self._inner.rollback(undo_answer)
        self._answer -= undo_answer
        left = num_tokens - undo_answer
        if left and self._ended:
            self._ended = False
            left -= 1
        if left > self._reasoning:
            raise ValueError(f"cannot roll back {num_tokens} tokens")
        self._reasoning -= left

    def is_terminated(self) -> bool:
        return self._ended and self._inner is not None and self._inner.is_terminated()

    def draft_masks(self, draft: list[int]) -> tuple[Tensor, int]:
        return draft_masks(self, draft)


def sequence_matcher(
    constraint: StructuredOutputsParams,
    compiled: Callable[[], Matcher],
    tokenizer: Any,
    stop_token_ids: list[int],
    vocab_size: int,
) -> Matcher:
    """One sequence's matcher: the backend's (``compiled``), behind a free reasoning part when
    the chat layer asked for one (``ReplyConstraint.reasoning_end``). Shared by the backends so
    the reasoning rules are the same whichever grammar library enforces the answer."""
    inner = compiled() if constraint.kind != "reasoning" else None
    end = constraint.reasoning_end if isinstance(constraint, ReplyConstraint) else None
    if end is None:
        assert inner is not None
        return inner
    assert isinstance(constraint, ReplyConstraint)
    end_id = tokenizer.token_to_id(end)
    if end_id is None or end_id >= vocab_size:
        raise InvalidRequestError("thinking", f"the tokenizer has no {end!r} token")
    return ReasoningMatcher(inner, end_id, stop_token_ids, vocab_size, constraint.reasoning_budget)
