"""KV compressor: pools every ``ratio`` consecutive tokens into one long-range entry.

Used three ways: the CSA main compressor (ratio 4, overlapping windows, head_dim wide), the
indexer's key compressor (same, index_head_dim wide) and the HCA compressor (large ratio, no
overlap). With overlap each token is projected twice (two halves of ``wkv``/``wgate``): the second
half joins its own window's entry, the first half the next window's, so each entry sees 2*ratio
tokens at stride ratio. Projections and the softmax pooling run in fp32.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from deepinfer.backends.base import Backend
from deepinfer.models.layers.norm import Linear, RMSNorm, fp32_param
from deepinfer.models.layers.rope import Rotary
from deepinfer.models.state import CompressorState, CompressorStates


class Compressor(nn.Module):
    def __init__(
        self,
        hidden: int,
        dim: int,
        ratio: int,
        *,
        overlap: bool,
        eps: float,
        dtype: torch.dtype,
    ) -> None:
        super().__init__()
        self.dim = dim
        self.ratio = ratio
        self.overlap = overlap
        width = 2 * dim if overlap else dim
        self.wkv = Linear(hidden, width, dtype)
        self.wgate = Linear(hidden, width, dtype)
        self.ape = fp32_param(ratio, width)
        self.norm = RMSNorm(dim, eps)

    def new_state(
        self, batch: int, dtype: torch.dtype, device: torch.device, slack: int = 0
    ) -> CompressorState:
        return CompressorState.empty(
            batch,
            ratio=self.ratio,
            overlap=self.overlap,
            dim=self.dim,
            dtype=dtype,
            device=device,
            slack=slack,
        )

    def forward(
        self,
        ops: Backend,
        x: Tensor,
        positions: Tensor,
        rotary: Rotary,
        state: CompressorStates,
    ) -> Tensor:
        """Feed ``x`` [B, S, d] at ``positions``; returns every entry emitted so far [B, T, D].

        With one state per row (a decode batch, ``positions`` [B, 1]) the rows' entries are
        zero-padded to the longest; callers mask by each row's visible count.
        """
        if isinstance(state, list):
            return self._forward_rows(ops, x, positions, rotary, state)
        xf = x.float()
        kv = ops.linear(xf, self.wkv.weight.float())
        score = ops.linear(xf, self.wgate.weight.float()) + self.ape[positions % self.ratio]
        state.remember(kv, score)
        kv = torch.cat((state.buf_kv, kv), dim=1)
        score = torch.cat((state.buf_score, score), dim=1)
        b, total, width = kv.shape
        n = total // self.ratio
        used = n * self.ratio
        state.buf_kv, state.buf_score = kv[:, used:], score[:, used:]
        if n == 0:
            return state.entries

        win_kv = kv[:, :used].view(b, n, self.ratio, width)
        win_score = score[:, :used].view(b, n, self.ratio, width)
        pooled = ops.compress(win_kv, win_score, state.prev_kv, state.prev_score, self.overlap)
        if self.overlap:
            state.prev_kv = win_kv[:, -1, :, : self.dim].clone()
            state.prev_score = win_score[:, -1, :, : self.dim].clone()

        entries = self.norm(ops, pooled.to(state.entries.dtype))
        first = state.num_entries
        entry_pos = torch.arange(first, first + n, device=x.device) * self.ratio
        cos, sin = rotary.cos_sin(entry_pos)
        entries = ops.rope(entries[:, :, None], cos, sin)[:, :, 0]
        state.entries = torch.cat((state.entries, entries), dim=1)
        return state.entries

    def _forward_rows(
        self,
        ops: Backend,
        x: Tensor,
        positions: Tensor,
        rotary: Rotary,
        states: list[CompressorState],
    ) -> Tensor:
        """One new token per row: buffer it, pool the rows whose window just filled."""
        xf = x.float()
        kv = ops.linear(xf, self.wkv.weight.float())
        score = ops.linear(xf, self.wgate.weight.float()) + self.ape[positions % self.ratio]
        full = append_rows(states, kv, score, self.ratio)
        if full:
            rows = [states[i] for i in full]
            win_kv = torch.cat([st.buf_kv for st in rows])[:, None]  # [F, 1, ratio, width]
            win_score = torch.cat([st.buf_score for st in rows])[:, None]
            prev_kv = prev_score = None
            if self.overlap:
                prev_kv, prev_score = _previous_halves(rows, win_kv, win_score, self.dim)
                halves_kv = win_kv[:, 0, :, : self.dim].clone().split(1)
                halves_score = win_score[:, 0, :, : self.dim].clone().split(1)
                for st, half_kv, half_score in zip(rows, halves_kv, halves_score, strict=True):
                    st.prev_kv, st.prev_score = half_kv, half_score
            pooled = ops.compress(win_kv, win_score, prev_kv, prev_score, self.overlap)
            entries = self.norm(ops, pooled.to(rows[0].entries.dtype))  # [F, 1, D]
            entry_pos = torch.tensor(
                [[st.num_entries * self.ratio] for st in rows], device=x.device
            )
            cos, sin = rotary.cos_sin(entry_pos)
            entries = ops.rope(entries[:, :, None], cos, sin)[:, :, 0]
            append_entries_to(rows, entries)
            closed = win_kv.new_zeros(1, 0, win_kv.shape[-1])  # every full window was pooled
            for st in rows:
                st.buf_kv, st.buf_score = closed, closed
        return padded_entries(states)


def append_rows(states: list[CompressorState], kv: Tensor, score: Tensor, ratio: int) -> list[int]:
    """Append row i's new projections [B, 1, width] to its open window; returns the rows whose
    window is now complete (their buffers hold exactly ``ratio`` rows)."""
    # Rows whose open windows are equally full are appended together (a few ops per fill
    # level, not per row); each row then keeps a view of its slice.
    by_fill: dict[int, list[int]] = {}
    for i, st in enumerate(states):
        if st.keep:
            st.remember(kv[i : i + 1], score[i : i + 1])
        by_fill.setdefault(st.buf_kv.shape[1], []).append(i)
    full = []
    for fill, rows in by_fill.items():
        if len(rows) == len(states):  # every row equally full (lockstep decoding)
            new_kv, new_score = kv, score
        else:
            sel = torch.tensor(rows, device=kv.device)
            new_kv, new_score = kv.index_select(0, sel), score.index_select(0, sel)
        if fill:
            new_kv = torch.cat((torch.cat([states[i].buf_kv for i in rows]), new_kv), dim=1)
            new_score = torch.cat((torch.cat([states[i].buf_score for i in rows]), new_score), 1)
        for i, row_kv, row_score in zip(rows, new_kv.split(1), new_score.split(1), strict=True):
            states[i].buf_kv, states[i].buf_score = row_kv, row_score
        if fill + 1 == ratio:
            full.extend(rows)
    return sorted(full)


def append_entries_to(rows: list[CompressorState], entries: Tensor) -> None:
    """Append one new entry per row: ``entries`` [F, 1, D] to the F states ``rows``."""
    for st, entry in zip(rows, entries.split(1), strict=True):
        st.entries = torch.cat((st.entries, entry), dim=1)


def padded_entries(states: list[CompressorState]) -> Tensor:
    """Every row's entries [B, T_max, D], zero past each row's own count (one gather)."""
    counts = [st.entries.shape[1] for st in states]
    first = states[0].entries
    out = first.new_zeros(len(states), max(counts), first.shape[-1])
    if max(counts):
        flat = torch.cat([st.entries for st in states], dim=1)[0]  # [sum T, D]
        rows = torch.repeat_interleave(torch.arange(len(states)), torch.tensor(counts))
        starts = torch.tensor([0, *counts]).cumsum(0)[:-1]
        cols = torch.arange(flat.shape[0]) - starts[rows]
        out[rows.to(out.device), cols.to(out.device)] = flat
    return out


def _previous_halves(
    rows: list[CompressorState], win_kv: Tensor, win_score: Tensor, dim: int
) -> tuple[Tensor, Tensor]:
    """Window -1 for each row: its stored first half, or zero weight before the first window."""
    ratio = win_kv.shape[2]
    kv = [st.prev_kv if st.prev_kv is not None else win_kv.new_zeros(1, ratio, dim) for st in rows]
    score = [
        st.prev_score
        if st.prev_score is not None
        else win_score.new_full((1, ratio, dim), float("-inf"))
        for st in rows
    ]
    return torch.cat(kv), torch.cat(score)
