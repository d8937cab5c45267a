"""V4.1 ratio-1/2 compressor, owned by a KV-source layer and read by its whole layer group.

Unlike V4's compressors there is no overlap and no position bias: ratio 1 turns every token into
an entry (``norm(wkv(x))``), ratio 2 pools each pair with a per-channel softmax of ``wgate``
scores. The pooled latent is normalised here and returned before RoPE, because the group's
indexer keys are projected from the un-rotated latent; the caller rotates both.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from deepinfer.backends.base import Backend
from deepinfer.backends.compress_verify_ref import VerifyPlan
from deepinfer.models.layers.compressor import (
    SlotPhase,
    close_windows,
    history_row,
    ragged_windows,
    slot_phase,
)
from deepinfer.models.layers.norm import Linear, RMSNorm
from deepinfer.models.layers.verify_windows import verify_plan
from deepinfer.models.layouts import CompressorRows, RaggedCompressor
from deepinfer.models.ragged_plan import ClosePlan
from deepinfer.models.state import CompressorState
from deepinfer.transfer import to_device


class SharedCompressor(nn.Module):
    def __init__(self, hidden: int, dim: int, ratio: int, *, eps: float) -> None:
        super().__init__()
        if ratio not in (1, 2):
            raise NotImplementedError(f"V4.1 compressor ratio {ratio}: only 1 and 2 exist")
        self.dim = dim
        self.ratio = ratio
        # fp32 projections of a 16-bit checkpoint weight: held in fp32 from the load on (in
        # bf16 where the backend computes fp32 products from it: ``hold_bf16_projections``).
        self.wkv = Linear(hidden, dim, torch.float32, computes_fp32=True)
        # A softmax over one slot is 1, so ratio 1 has no gate at all.
        self.wgate: Linear | None = (
            Linear(hidden, dim, torch.float32, computes_fp32=True) if ratio > 1 else None
        )
        self.norm = RMSNorm(dim, eps)

    def new_state(
        self, batch: int, dtype: torch.dtype, device: torch.device, slack: int = 0
    ) -> CompressorState:
        return CompressorState.empty(
            batch,
            ratio=self.ratio,
            overlap=False,
            dim=self.dim,
            dtype=dtype,
            device=device,
            slack=slack,
        )

    def forward(self, ops: Backend, x: Tensor, state: CompressorState) -> tuple[Tensor, Tensor]:
        """Feed ``x`` [B, S, d]; returns (new normalised latents [B, n, D], the entry index of
        the first as a 0-d tensor).

        The open half of a pair waits in ``state.buf_kv``/``buf_score`` (fp32) for its partner,
        so a chunk boundary inside a pair changes nothing.
        """
        kv, score = self._project(ops, x)
        first = to_device(torch.tensor(state.num_entries), x.device)
        windows = close_windows(state, kv, score)
        if windows is None:
            return kv.new_zeros(kv.shape[0], 0, self.dim).to(state.entry_dtype), first
        pooled = ops.compress(*windows, None, None, False, dtype=state.entry_dtype)
        return self.norm(ops, pooled), first

    def _project(self, ops: Backend, x: Tensor) -> tuple[Tensor, Tensor]:
        kv = self.wkv(ops, x)
        if self.wgate is None:
            return kv, torch.zeros_like(kv)
        return kv, self.wgate(ops, x)

    def forward_slots(
        self, ops: Backend, x: Tensor, positions: Tensor, rows: CompressorRows
    ) -> tuple[Tensor, SlotPhase]:
        """One new token per decode row, rows of shared buffers: (every row's normalised latent
        [B, 1, D], zeros where its pair is still open, and where the rows stand in their
        pairs); no host work."""
        kv, score = self._project(ops, x)
        at = slot_phase(rows, positions)
        ring = history_row(rows, at)
        assert rows.pool.pages is not None
        row = (kv[:, 0], score[:, 0], None, rows.pool, rows.slots, at.phase, ring)
        return self.norm(ops, ops.compress_slots(*row, False, rows.pool.pages.dtype)), at

    def forward_verify(
        self, ops: Backend, x: Tensor, rows: CompressorRows
    ) -> tuple[Tensor, VerifyPlan]:
        """A verification pass's tokens [B, T, d] over shared buffers: (the normalised latents
        [B, W, D] of each row's candidate pairs, complete or not, and which close); no host
        work (:mod:`.verify_windows`)."""
        kv, score = self._project(ops, x)
        plan, pages = verify_plan(rows, ops), rows.pool.pages
        assert pages is not None
        pooled = ops.compress_verify(
            kv, score, None, rows.pool, rows.slots, plan, False, pages.dtype
        )
        return self.norm(ops, pooled), plan

    def forward_ragged(
        self, ops: Backend, x: Tensor, comp: RaggedCompressor
    ) -> tuple[Tensor, ClosePlan]:
        """The new tokens [1, N, d] of a ragged pass's spans: (the normalised latents
        [W, 1, D] of every span's completed pairs, pooled in one op, and which windows they
        are); the open halves wait in the shared buffers."""
        kv, score = self._project(ops, x[0])
        windows = ragged_windows(comp, kv, score, 0)
        assert comp.pool.pages is not None
        dtype = comp.pool.pages.dtype
        if not windows.plan.num_windows:
            return kv.new_zeros(0, 1, self.dim).to(dtype), windows.plan
        pooled = ops.compress(
            windows.kv[:, None], windows.score[:, None], None, None, False, dtype=dtype
        )
        return self.norm(ops, pooled), windows.plan
