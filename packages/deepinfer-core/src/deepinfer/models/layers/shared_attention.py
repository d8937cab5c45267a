"""V4.1 attention: each layer's own sliding window plus top-k entries of a shared compressor.

Per layer the query, the SWA kv, the sinks and the grouped output projection are V4's (without
the per-head query norm when ``q_head_norm`` is off). Long-range keys are not the layer's own:
a ratio-1/2 layer attends to the top-k compressed entries of its group's KV-source layer, chosen
by its group's latest index-source layer. Source layers publish entries, keys and picks into a
:class:`SharedKV` for the layers after them; their persistent parts (entries, index keys, the
open pair) live in the source layer's state. With ratio 1 entry t is visible from position t.
"""

from __future__ import annotations

import torch
from torch import Tensor

from deepinfer.backends.base import Backend
from deepinfer.config import ModelConfig
from deepinfer.models.layers.attention import MQA, init_mqa
from deepinfer.models.layers.candidate_indexer import LongRange, SharedIndexer, SharedKV
from deepinfer.models.layers.compressor import (
    ragged_entries,
    ragged_entry_angles,
    write_ragged_entries,
    write_slot_entries,
)
from deepinfer.models.layers.rope import Rotary
from deepinfer.models.layers.shared_compressor import SharedCompressor
from deepinfer.models.layers.verify_windows import verify_entry_angles, write_verify_entries
from deepinfer.models.layers.visibility import visible_mask
from deepinfer.models.layouts import RaggedRows, SlotRows
from deepinfer.models.ragged_plan import ScoreGroup, by_score_group, group_entries
from deepinfer.models.ring import SWARing
from deepinfer.models.state import CompressorState, LayerState
from deepinfer.paging import PagedEntries, dense_entries


class SharedAttention(MQA):
    def __init__(self, cfg: ModelConfig, layer_id: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.cfg = cfg
        self.layer_id = layer_id
        self.ratio = cfg.compress_ratio(layer_id)
        d = init_mqa(self, cfg, dtype)
        self.q_head_norm = cfg.q_head_norm
        is_main = layer_id < cfg.num_hidden_layers
        self.is_kv_source = is_main and layer_id in cfg.kv_source_layer_ids
        self.is_index_source = is_main and layer_id in cfg.index_source_layer_ids
        self.kv_source = cfg.kv_source_of(layer_id) if self.ratio else None
        self.index_source = cfg.index_source_of(layer_id) if self.ratio else None
        cand = cfg.candidate_source_layer_id
        self.publishes_candidates = self.is_index_source and layer_id == cand
        self.uses_candidates = self.is_index_source and cand is not None and layer_id > cand
        self.compressor: SharedCompressor | None = None
        self.indexer: SharedIndexer | None = None
        if self.is_kv_source:
            self.compressor = SharedCompressor(d, self.head_dim, self.ratio, eps=cfg.rms_norm_eps)
        if self.is_kv_source or self.is_index_source:
            self.indexer = SharedIndexer(
                cfg, owns_keys=self.is_kv_source, owns_query=self.is_index_source, dtype=dtype
            )

    def new_state(
        self, batch: int, dtype: torch.dtype, device: torch.device, slack: int = 0
    ) -> LayerState:
        ring = torch.zeros(batch, self.window + slack, self.head_dim, dtype=dtype, device=device)
        state = LayerState(swa=SWARing(ring, window=self.window))
        if self.compressor is not None:
            state.compressor = self.compressor.new_state(batch, dtype, device, slack)
            # Index keys are derived from finished entries only (no buffers): truncating them
            # is their whole rollback, so they keep no history.
            state.indexer = CompressorState.empty(
                batch,
                ratio=self.ratio,
                overlap=False,
                dim=self.cfg.index_head_dim,
                dtype=dtype,
                device=device,
                entries_only=True,
            )
        return state

    def _update_sources(
        self,
        ops: Backend,
        x: Tensor,
        rotary: Rotary,
        state: LayerState,
        shared: SharedKV,
    ) -> None:
        """KV source: pool new entries, derive their index keys, publish both."""
        assert self.compressor is not None and self.indexer is not None
        entry_states, key_states = state.compressor, state.indexer
        assert entry_states is not None and key_states is not None
        latents, first = self.compressor(ops, x, entry_states)
        if latents.numel():
            n = latents.shape[1]
            entry_pos = (first + torch.arange(n, device=x.device)) * self.ratio
            cos, sin = rotary.cos_sin(entry_pos)
            keys = self.indexer.keys(ops, latents, cos, sin).to(latents.dtype)
            entries = ops.rope(latents[:, :, None], cos, sin)[:, :, 0]
            entry_states.append_entries(entries)
            key_states.append_entries(keys)
        shared.entries[self.layer_id] = entry_states.entries
        shared.keys[self.layer_id] = key_states.entries

    def _update_slot_sources(  # noqa: PLR0917
        self,
        ops: Backend,
        x: Tensor,
        positions: Tensor,
        rotary: Rotary,
        rows: SlotRows,
        shared: SharedKV,
    ) -> None:
        """KV source over shared slot rows: every row's entry and index key (provisional where
        its pair is open) written by index, both published for all rows."""
        assert self.compressor is not None and self.indexer is not None
        assert rows.compressor is not None and rows.indexer is not None
        latents, at = self.compressor.forward_slots(ops, x, positions, rows.compressor)
        cos, sin = rotary.cos_sin(at.entry_pos)
        keys = self.indexer.keys(ops, latents, cos, sin).to(latents.dtype)
        entries = ops.rope(latents[:, :, None], cos, sin)[:, :, 0]
        shared.entries[self.layer_id] = write_slot_entries(rows.compressor, at, entries)
        shared.keys[self.layer_id] = write_slot_entries(rows.indexer, at, keys)

    def _update_verify_sources(
        self, ops: Backend, x: Tensor, rotary: Rotary, rows: SlotRows, shared: SharedKV
    ) -> None:
        """KV source over verification rows: each row's completed pairs' entries and index
        keys written by index (the rest to the padding slot), every row's published."""
        assert self.compressor is not None and self.indexer is not None
        assert rows.compressor is not None and rows.indexer is not None
        latents, plan = self.compressor.forward_verify(ops, x, rows.compressor)
        cos, sin = verify_entry_angles(rows.compressor, plan, rotary)
        keys = self.indexer.keys(ops, latents, cos, sin).to(latents.dtype)
        entries = ops.rope(latents[:, :, None], cos, sin)[:, :, 0]
        shared.entries[self.layer_id] = write_verify_entries(rows.compressor, plan, entries)
        shared.keys[self.layer_id] = write_verify_entries(rows.indexer, plan, keys)

    def _update_ragged_sources(
        self, ops: Backend, x: Tensor, rotary: Rotary, rows: RaggedRows, shared: SharedKV
    ) -> None:
        """KV source over a ragged pass's spans: every completed pair's entry and index key
        written by index, every span's published."""
        assert self.compressor is not None and self.indexer is not None
        assert rows.compressor is not None and rows.indexer is not None
        latents, plan = self.compressor.forward_ragged(ops, x, rows.compressor)
        if plan.num_windows:
            cos, sin = ragged_entry_angles(rows.compressor, plan, rotary)
            keys = self.indexer.keys(ops, latents, cos, sin).to(latents.dtype)
            entries = ops.rope(latents[:, :, None], cos, sin)[:, :, 0]
            write_ragged_entries(rows.compressor, plan, entries)
            write_ragged_entries(rows.indexer, plan, keys)
        shared.entries[self.layer_id] = ragged_entries(rows.compressor, plan)
        shared.keys[self.layer_id] = ragged_entries(rows.indexer, plan)

    def _pick(  # noqa: PLR0917
        self,
        ops: Backend,
        x: Tensor,
        qr: Tensor,
        positions: Tensor,
        rotary: Rotary,
        keys: Tensor | PagedEntries,
        shared: SharedKV,
        group: int = 0,
    ) -> Tensor:
        """This index source's picks [B, S, k] for queries ``x``/``qr`` at ``positions``
        against ``keys`` [B, T, c]; publishes candidates under ``group``."""
        assert self.indexer is not None
        visible = visible_mask(positions, self.ratio, keys.shape[1], x.shape[0])
        scores = self.indexer.scores(ops, x, qr, positions, rotary=rotary, keys=keys)
        picks, candidates = self.indexer.select(
            ops,
            scores,
            visible,
            within=shared.candidates[group] if self.uses_candidates else None,
            publish_candidates=self.publishes_candidates,
            own_candidates=self.cfg.candidate_source_uses_candidates,
        )
        if candidates is not None:
            shared.candidates[group] = candidates
        return picks

    def long_range(  # noqa: PLR0917
        self,
        ops: Backend,
        x: Tensor,
        qr: Tensor,
        positions: Tensor,
        rotary: Rotary,
        state: LayerState | SlotRows | RaggedRows,
        shared: SharedKV | None,
    ) -> LongRange | None:
        if not self.ratio:
            return None
        assert shared is not None
        if self.is_kv_source and isinstance(state, SlotRows) and state.tokens is not None:
            self._update_verify_sources(ops, x, rotary, state, shared)
        elif self.is_kv_source and isinstance(state, SlotRows):
            self._update_slot_sources(ops, x, positions, rotary, state, shared)
        elif self.is_kv_source and isinstance(state, RaggedRows):
            self._update_ragged_sources(ops, x, rotary, state, shared)
        elif self.is_kv_source:
            self._update_sources(ops, x, rotary, state, shared)
        # The shared entries and this layer's queries' picks among them.
        assert self.kv_source is not None and self.index_source is not None
        entries = shared.entries[self.kv_source]
        keys = shared.keys[self.kv_source]
        if not isinstance(state, RaggedRows):
            if self.is_index_source:
                picks = self._pick(ops, x, qr, positions, rotary, keys, shared)
                shared.picks[self.layer_id] = picks
            return LongRange(entries, picks=shared.picks[self.index_source])
        if self.is_index_source:  # each span's queries against its own keys, by score group
            assert self.indexer is not None
            per_span = dense_entries(keys)

            def picks_of(b: int, g: ScoreGroup) -> Tensor:
                x_g, qr_g, at = x[0, g.tokens], qr[0, g.tokens], positions[g.tokens]
                limit = group_entries(state.meta, g, self.ratio)
                keys_g = per_span[:, :limit].index_select(0, g.spans)
                return self._pick(ops, x_g, qr_g, at, rotary, keys_g, shared, b)

            width = min(self.indexer.topk, per_span.shape[1])
            shared.picks[self.layer_id] = by_score_group(state.meta, width, picks_of)
        span_of = state.meta.token_span
        return LongRange(entries, picks=shared.picks[self.index_source], span_of=span_of)
