"""The state pool: per-request model state under one memory budget.

A V4 sequence carries, per layer, an SWA ring of ``sliding_window`` rows, and on compressed
layers the append-only compressed entries (one per ``ratio`` tokens), the indexer keys (CSA) and
small partial-window buffers. The pool charges each request for the bytes its state will hold at
the length it is about to reach; the scheduler admits, grows and preempts against that account,
so the budget is never exceeded and nothing is allocated that could not be paid for.
"""

from __future__ import annotations

import torch

from deepinfer.config import CSA_RATIO, ModelConfig
from deepinfer.models.state import BUFFERS, ModelState


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
    """Charges requests for their state bytes against ``budget_bytes``.

    The scheduler asks several times per request and step, so the charge is kept as a running
    total and :func:`state_bytes` as its per-ratio coefficients (it is exact: the entries of
    each ratio grow by one every ``ratio`` tokens)."""

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, budget_bytes: int) -> None:
        self.cfg = cfg
        self.dtype = dtype
        self.budget_bytes = budget_bytes
        self._charged: dict[str, int] = {}
        self.used_bytes = 0
        self._fixed = state_bytes(cfg, dtype, 0)
        self._per_entry: dict[int, int] = {}  # ratio -> bytes per entry, over all layers
        for ratio in sorted({r for r in cfg.compress_ratios if r}):
            # num_tokens = ratio adds exactly one entry to every layer of this ratio (and to
            # layers of a divisor ratio, which the smaller ratios' coefficients already hold).
            grown = state_bytes(cfg, dtype, ratio) - self._fixed
            self._per_entry[ratio] = grown - sum(
                b * (ratio // r) for r, b in self._per_entry.items()
            )

    def bytes_for(self, num_tokens: int) -> int:
        total = self._fixed
        for ratio, size in self._per_entry.items():
            total += size * (num_tokens // ratio)
        return total

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

    def is_charged(self, request_id: str) -> bool:
        return request_id in self._charged


def state_nbytes(state: ModelState) -> int:
    """Bytes actually held by a state's tensors (to check the pool's accounting)."""
    total = 0
    for layer in state.layers:
        total += layer.swa.kv.numel() * layer.swa.kv.element_size()
        for comp in (layer.compressor, layer.indexer):
            if comp is None:
                continue
            for name in (*BUFFERS[:-1], "entries"):  # the entries in use, not the capacity
                t = getattr(comp, name)
                if t is not None:
                    total += t.numel() * t.element_size()
    return total
