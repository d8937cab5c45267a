"""Explicit per-sequence decoding state for DeepSeek-V4.

The model never hides state inside modules: every forward takes a :class:`ModelState` and
advances it, so the engine can own, copy and pool these objects. Per layer there is

* an SWA ring of the last ``sliding_window`` post-RoPE kv rows (slot = position % window);
* for compressed layers, a :class:`CompressorState`: the open (partial) window's raw projections,
  for the overlapping ratio-4 compressor the first half of the last complete window, and the
  append-only compressed entries, indexed by absolute window number;
* for CSA layers, a second :class:`CompressorState` for the lightning indexer's keys.

All tensors carry a leading batch dimension; the sequences of one state advance in lockstep.

V4.1 reuses the same objects: a KV-source layer keeps its ratio-1/2 compressor in ``compressor``
(no overlap, so ``prev_kv`` stays None) and its indexer keys in ``indexer`` (entries only; index
keys are derived from finished entries, so the buffers stay empty); the layers that share them
keep only their SWA ring. Engram hashes the last few token ids, kept in
:attr:`ModelState.token_history`. The lagged mHC carry lives within one token's pass through the
layers, so it needs no state.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch
from torch import Tensor


@dataclass
class SWARing:
    """The sliding window of one layer: ``kv[:, p % capacity]`` holds position p's row.

    The ring holds ``window + slack`` rows: the attention window plus the rows a rollback of up
    to ``slack`` tokens needs back (a speculative step overwrites them otherwise).
    """

    kv: Tensor  # [B, capacity, D]
    length: int = 0  # tokens written so far
    window: int = 0  # attention window; 0 = the whole capacity

    def __post_init__(self) -> None:
        if not self.window:
            self.window = self.capacity

    @property
    def capacity(self) -> int:
        return self.kv.shape[1]

    def read(self, start: int) -> tuple[Tensor, Tensor]:
        """Rows queries from ``start`` on can still see: positions start-window+1 .. start-1."""
        first = max(0, start - self.window + 1)
        positions = torch.arange(first, start, device=self.kv.device)
        return self.kv[:, positions % self.capacity], positions

    def write(self, kv: Tensor, start: int) -> None:
        keep = min(kv.shape[1], self.capacity)
        positions = torch.arange(start + kv.shape[1] - keep, start + kv.shape[1], device=kv.device)
        self.kv[:, positions % self.capacity] = kv[:, -keep:].to(self.kv.dtype)
        self.length = start + kv.shape[1]


@dataclass
class CompressorState:
    """One compressor's running state (main KV compressor or indexer-key compressor)."""

    ratio: int
    overlap: bool
    buf_kv: Tensor  # [B, < ratio, c*D] fp32 projections of the open window
    buf_score: Tensor  # [B, < ratio, c*D] fp32 gate scores, position bias added
    entries: Tensor  # [B, T, D] finished entries (normalised, rotated), model dtype
    prev_kv: Tensor | None = None  # [B, ratio, D] overlap: first half of the last full window
    prev_score: Tensor | None = None
    #: Rollback support: the raw projections of the last ``keep`` tokens (fp32, like the
    #: buffers), from which the buffers of an earlier length are rebuilt. keep = 0: none kept.
    keep: int = 0
    hist_kv: Tensor | None = None  # [B, <= keep, c*D]
    hist_score: Tensor | None = None

    @property
    def num_entries(self) -> int:
        return self.entries.shape[1]

    @classmethod
    def empty(
        cls,
        batch: int,
        *,
        ratio: int,
        overlap: bool,
        dim: int,
        dtype: torch.dtype,
        device: torch.device,
        slack: int = 0,
    ) -> CompressorState:
        """An empty state; ``slack`` > 0 keeps enough history to roll back that many tokens."""
        width = 2 * dim if overlap else dim
        empty = torch.zeros(batch, 0, width, dtype=torch.float32, device=device)
        return cls(
            ratio=ratio,
            overlap=overlap,
            buf_kv=empty,
            buf_score=empty,
            entries=torch.zeros(batch, 0, dim, dtype=dtype, device=device),
            keep=slack + 2 * ratio if slack else 0,
            hist_kv=empty if slack else None,
            hist_score=empty if slack else None,
        )

    def remember(self, kv: Tensor, score: Tensor) -> None:
        """Keep the newest raw projections [B, S, c*D] for rollback (no-op without slack)."""
        if not self.keep:
            return
        assert self.hist_kv is not None and self.hist_score is not None
        self.hist_kv = torch.cat((self.hist_kv, kv), dim=1)[:, -self.keep :]
        self.hist_score = torch.cat((self.hist_score, score), dim=1)[:, -self.keep :]


@dataclass
class LayerState:
    swa: SWARing
    compressor: CompressorState | None = None
    indexer: CompressorState | None = None


@dataclass
class ModelState:
    """Everything a sequence (or a lockstep batch of them) carries between forward calls."""

    layers: list[LayerState]
    mtp: list[LayerState] = field(default_factory=list)
    pos: int = 0  # tokens consumed by the main model
    #: Tokens a rollback may take back (``model.new_state(slack=...)``), and the length of the
    #: last rollback: tokens before it are final, so no later rollback goes below it.
    slack: int = 0
    committed: int = 0
    mtp_pos: int = 0  # positions consumed by the MTP layers
    #: V4.1 Engram only: [B, engram_max_ngram_size - 1] raw token ids before ``pos`` (oldest
    #: first), the pad id where the sequence is shorter. A state restored from a prefix cache
    #: must set it to the prefix's last ids. None for models without Engram.
    token_history: Tensor | None = None

    @property
    def batch_size(self) -> int:
        return self.layers[0].swa.kv.shape[0]


@dataclass
class Packed:
    """Chunks of several sequences packed along the sequence dim of one [1, N] batch.

    Token-wise work (projections, MoE, mHC) runs once over all N tokens; each layer's attention
    walks the spans, each with its own sequence's state.
    """

    states: list[LayerState]
    lengths: list[int]

    def spans(self) -> list[tuple[slice, LayerState]]:
        out, start = [], 0
        for state, n in zip(self.states, self.lengths, strict=True):
            out.append((slice(start, start + n), state))
            start += n
        return out


#: What a layer's forward receives: the state of a lockstep chunk, one state per decode row
#: ([B, 1] layout), or packed spans ([1, N] layout).
LayerStates = LayerState | list[LayerState] | Packed
CompressorStates = CompressorState | list[CompressorState]


def compressor_states(state: LayerStates, which: str = "compressor") -> CompressorStates:
    """A layer's ``compressor`` (or ``indexer``) state, per row when ``state`` is per row."""
    assert not isinstance(state, Packed), "packed spans are split before this point"
    if isinstance(state, list):
        rows = [getattr(s, which) for s in state]
        assert all(r is not None for r in rows)
        return rows
    found = getattr(state, which)
    assert found is not None
    return found


def clone_state(state: ModelState) -> ModelState:
    """A deep copy (for branching a sequence, e.g. before a speculative draft)."""
    return copy.deepcopy(state)
