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
    """The sliding window of one layer: ``kv[:, p % window]`` holds position p's row."""

    kv: Tensor  # [B, window, D]
    length: int = 0  # tokens written so far

    @property
    def window(self) -> int:
        return self.kv.shape[1]

    def read(self, start: int) -> tuple[Tensor, Tensor]:
        """Rows queries from ``start`` on can still see: positions start-window+1 .. start-1."""
        first = max(0, start - self.window + 1)
        positions = torch.arange(first, start, device=self.kv.device)
        return self.kv[:, positions % self.window], positions

    def write(self, kv: Tensor, start: int) -> None:
        keep = min(kv.shape[1], self.window)
        positions = torch.arange(start + kv.shape[1] - keep, start + kv.shape[1], device=kv.device)
        self.kv[:, positions % self.window] = kv[:, -keep:].to(self.kv.dtype)
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
    ) -> CompressorState:
        width = 2 * dim if overlap else dim
        return cls(
            ratio=ratio,
            overlap=overlap,
            buf_kv=torch.zeros(batch, 0, width, dtype=torch.float32, device=device),
            buf_score=torch.zeros(batch, 0, width, dtype=torch.float32, device=device),
            entries=torch.zeros(batch, 0, dim, dtype=dtype, device=device),
        )


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
    mtp_pos: int = 0  # positions consumed by the MTP layers
    #: V4.1 Engram only: [B, engram_max_ngram_size - 1] raw token ids before ``pos`` (oldest
    #: first), the pad id where the sequence is shorter. A state restored from a prefix cache
    #: must set it to the prefix's last ids. None for models without Engram.
    token_history: Tensor | None = None

    @property
    def batch_size(self) -> int:
        return self.layers[0].swa.kv.shape[0]


def clone_state(state: ModelState) -> ModelState:
    """A deep copy (for branching a sequence, e.g. before a speculative draft)."""
    return copy.deepcopy(state)
