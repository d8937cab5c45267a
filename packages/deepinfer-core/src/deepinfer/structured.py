"""What the engine needs from a grammar backend (the ``deepinfer.grammars`` plugins).

Core only knows these protocols; ``deepinfer-structured`` implements them on xgrammar and on
llguidance (and ``auto``, which picks one per constraint). A backend
is built once per engine from the tokenizer, compiles a request's constraint at submit time
(errors fail that request alone) and gives each sequence its own matcher.

:class:`ReplyConstraint` extends the public constraint with what only the chat layer knows: the
chat template may open a DSML tool-call block the reply must complete, and with thinking on the
constraint governs the answer after ``</think>`` while the reasoning stays free.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from tokenizers import Tokenizer
from torch import Tensor

from deepinfer.errors import InvalidRequestError
from deepinfer.sampling_params import StructuredOutputsParams


class GrammarMatcher(Protocol):
    """Where one sequence stands in its grammar."""

    def allowed(self) -> Tensor:
        """Bool mask [vocab_size] of the tokens the grammar accepts next."""
        ...

    def fill_bitmask(self, bitmask: Tensor, row: int) -> None:
        """Write the allowed tokens into row ``row`` of an int32 bitmask [batch, ceil(V/32)]
        (bit ``t % 32`` of word ``t // 32`` set = token ``t`` allowed): the batched form of
        :meth:`allowed`, which skips building a bool tensor per request."""
        ...

    def accept(self, token_id: int) -> bool:
        """Advance by one token; False (and no change) if the grammar rejects it."""
        ...

    def rollback(self, num_tokens: int) -> None:
        """Undo the last ``num_tokens`` accepted tokens (rejected speculative drafts)."""
        ...

    def is_terminated(self) -> bool:
        """True once the grammar is complete and a stop token was accepted."""
        ...

    def draft_masks(self, draft: list[int]) -> tuple[Tensor, int]:
        """Masks [len(draft) + 1, vocab] for verifying ``draft``, and how many draft tokens
        the grammar accepts (drafting stops at the first violating token). The matcher ends
        where it started."""
        ...


class GrammarBackend(Protocol):
    def __init__(
        self, tokenizer: Tokenizer, vocab_size: int, stop_token_ids: list[int]
    ) -> None: ...

    def matcher(self, constraint: StructuredOutputsParams) -> GrammarMatcher:
        """Compile (cached) and start a matcher; raises InvalidRequestError on a bad constraint."""
        ...


@dataclass(frozen=True)
class DsmlTool:
    """One tool a required DSML tool call may name; ``parameters`` is its JSON schema."""

    name: str
    parameters: str  # compact JSON of the arguments schema; "" when the tool takes none


@dataclass(frozen=True)
class ReplyConstraint(StructuredOutputsParams):
    """The constraint of a chat reply, as the chat template shapes it.

    Exactly one of the inherited kinds, or ``tool_calls``, or (with a reasoning budget) none:

    - ``tool_calls``: the prompt already opened a DSML tool-call block (``tool_choice`` required
      or named); the reply must be one or more invokes of these tools, with arguments valid
      under each tool's schema, then the block's end. ``dsml`` picks the tag spelling.
    - ``reasoning_end``: the text of the token that ends the reasoning (``</think>``). Until the
      model emits it every token but a stop token is allowed; the constraint governs the rest.
      ``reasoning_budget`` caps the reasoning: after that many tokens only the end token is
      allowed, so a reply is sure to reach its answer.
    """

    tool_calls: tuple[DsmlTool, ...] | None = None
    dsml: Literal["v4", "v4.1"] = "v4.1"
    reasoning_end: str | None = None
    reasoning_budget: int | None = None

    def _set(self) -> list[str]:
        chosen = super()._set()
        if self.tool_calls is not None:
            chosen.append("tool_calls")
        if not chosen and self.reasoning_end is not None and self.reasoning_budget is not None:
            chosen.append("reasoning")  # a budget alone: free reasoning, then a free answer
        return chosen

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.tool_calls is not None and not self.tool_calls:
            raise InvalidRequestError("tools", "a required tool call needs at least one tool")
        if self.reasoning_budget is not None and (
            self.reasoning_end is None or self.reasoning_budget < 0
        ):
            raise InvalidRequestError(
                "thinking.budget_tokens", "must be a non-negative count, with thinking on"
            )
