"""The state pool: per-request model state under one memory budget.

A V4 sequence carries, per layer, an SWA ring of ``sliding_window`` rows, and on compressed
layers the append-only compressed entries (one per ``ratio`` tokens), the indexer keys (CSA) and
small partial-window buffers. The entries live in pages of 128 tokens' worth
(:mod:`deepinfer.cache.pages`). The pool charges each request for the bytes its state will hold
at the length it is about to reach, whole pages included; the scheduler admits, grows and
preempts against that account, so the budget is never exceeded and the page list, sized from
the same budget, never runs dry.
"""

from __future__ import annotations

import torch

from deepinfer.config import CSA_RATIO, ModelConfig
from deepinfer.models.state import BUFFERS, ModelState
from deepinfer.paging import PAGE_TOKENS, pages_for


def state_bytes(cfg: ModelConfig, dtype: torch.dtype, num_tokens: int) -> int:
    """Upper bound on the bytes of one sequence's state after ``num_tokens`` tokens."""
    el = torch.empty((), dtype=dtype).element_size()
    f32 = 4
    if cfg.kv_source_layer_ids:  # V4.1: only KV sources own compressed entries and index keys
        total = cfg.num_hidden_layers * cfg.sliding_window * cfg.head_dim * el
        for layer in cfg.kv_source_layer_ids:
            ratio = cfg.compress_ratios[layer]
            total += (num_tokens // ratio) * (cfg.head_dim + cfg.index_head_dim) * el
            total += 2 * ratio * cfg.head_dim * f32  # the open group's projections and scores
            total += 2 * ratio * cfg.index_head_dim * f32  # the index keys' (unused) buffers
        return total + 8 * max(cfg.engram_max_ngram_size, 1)  # Engram's token history
    total = 0
    for layer in range(cfg.num_hidden_layers):
        total += cfg.sliding_window * cfg.head_dim * el
        ratio = cfg.compress_ratios[layer]
        if ratio == 0:
            continue
        overlap = ratio == CSA_RATIO
        dims = [cfg.head_dim] + ([cfg.index_head_dim] if overlap else [])
        for dim in dims:
            width = 2 * dim if overlap else dim
            total += (num_tokens // ratio) * dim * el  # entries
            total += 2 * ratio * width * f32  # open-window projections and scores
            if overlap:
                total += 2 * ratio * dim * f32  # the previous window's first half
    return total


class StatePool:
    """Charges requests for their state bytes against ``budget_bytes``: the fixed part
    (:func:`state_bytes` at length 0) plus one entry page (the entries of 128 tokens, every
    compressor) per started 128-token block, as :class:`~deepinfer.cache.pages.PageTable`
    hands them out."""

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, budget_bytes: int) -> None:
        self.cfg = cfg
        self.dtype = dtype
        self.budget_bytes = budget_bytes
        self._charged: dict[str, int] = {}
        self.used_bytes = 0
        self._fixed = state_bytes(cfg, dtype, 0)
        #: Bytes of one page over all compressors (every ratio divides the page's tokens).
        self.page_bytes = state_bytes(cfg, dtype, PAGE_TOKENS) - self._fixed

    def bytes_for(self, num_tokens: int) -> int:
        return self._fixed + pages_for(num_tokens) * self.page_bytes

    def max_pages(self, max_num_seqs: int, max_model_len: int) -> int:
        """Pages that ``max_num_seqs`` sequences of up to ``max_model_len`` tokens can be
        charged for within the budget."""
        if not self.page_bytes:
            return 0
        full = max_num_seqs * pages_for(max_model_len)
        return max(1, min(self.budget_bytes // self.page_bytes, full))

    def fits_alone(self, num_tokens: int) -> bool:
        return self.bytes_for(num_tokens) <= self.budget_bytes

    def try_reserve(self, request_id: str, num_tokens: int) -> bool:
        """Charge ``request_id`` for a state of ``num_tokens`` tokens (grow only) if the budget
        allows; whether the charge now covers that length."""
        want = self.bytes_for(num_tokens)
        current = self._charged.get(request_id, 0)
        if want <= current:
            return True
        if self.used_bytes - current + want > self.budget_bytes:
            return False
        self._charged[request_id] = want
        self.used_bytes += want - current
        return True

    def free(self, request_id: str) -> None:
        self.used_bytes -= self._charged.pop(request_id, 0)


def state_nbytes(state: ModelState) -> int:
    """Bytes actually held by a state's tensors (to check the pool's accounting)."""
    total = 0
    for layer in state.layers:
        total += layer.swa.kv.numel() * layer.swa.kv.element_size()
        for comp in (layer.compressor, layer.indexer):
            if comp is None:
                continue
            for name in (*BUFFERS, "entries"):  # the entries in use, not the capacity
                t = getattr(comp, name)
                if t is not None:
                    total += t.numel() * t.element_size()
    return total
