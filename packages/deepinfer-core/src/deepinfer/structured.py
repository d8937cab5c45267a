"""What the engine needs from a grammar backend (the ``deepinfer.grammars`` plugins).

Core only knows these protocols; ``deepinfer-structured`` implements them on xgrammar. A backend
is built once per engine from the tokenizer, compiles a request's constraint at submit time
(errors fail that request alone) and gives each sequence its own matcher.
"""

from __future__ import annotations

from typing import Protocol

from tokenizers import Tokenizer
from torch import Tensor

from deepinfer.sampling_params import StructuredOutputsParams


class GrammarMatcher(Protocol):
    """Where one sequence stands in its grammar."""

    def allowed(self) -> Tensor:
        """Bool mask [vocab_size] of the tokens the grammar accepts next."""
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
