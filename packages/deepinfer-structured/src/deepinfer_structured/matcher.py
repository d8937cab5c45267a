"""One sequence's position in its grammar, over xgrammar's matcher."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor


class XGrammarMatcher:
    def __init__(self, xgr: Any, compiled: Any, vocab_size: int) -> None:
        self._xgr = xgr
        self._m = xgr.GrammarMatcher(compiled)
        self.vocab_size = vocab_size
        self._bitmask = xgr.allocate_token_bitmask(1, vocab_size)

    def allowed(self) -> Tensor:
        self._m.fill_next_token_bitmask(self._bitmask)
        words = self._bitmask[0].to(torch.int64) & 0xFFFFFFFF
        bits = (words[:, None] >> torch.arange(32)) & 1
        return bits.flatten()[: self.vocab_size].bool()

    def accept(self, token_id: int) -> bool:
        return bool(self._m.accept_token(token_id))

    def rollback(self, num_tokens: int) -> None:
        if num_tokens:
            self._m.rollback(num_tokens)

    def is_terminated(self) -> bool:
        return bool(self._m.is_terminated())

    def draft_masks(self, draft: list[int]) -> tuple[Tensor, int]:
        masks = torch.zeros(len(draft) + 1, self.vocab_size, dtype=torch.bool)
        accepted = 0
        for i, token in enumerate(draft):
            masks[i] = self.allowed()
            if not masks[i, token] or not self.accept(token):
                break
            accepted += 1
        else:
            masks[len(draft)] = self.allowed()
        self.rollback(accepted)
        return masks[: accepted + 1], accepted
