"""Shared-KV MQA with attention sinks, and its three long-range variants.

One 512-wide kv head serves as both key and value for every query head. Each layer sees its own
sliding window of ``sliding_window`` recent rows; compressed layers add long-range entries:

* ``swa``: the window only (base-theta RoPE, no YaRN);
* ``csa``: plus the compressed entries the lightning indexer picks per query (top-k);
* ``hca``: plus every compressed entry whose whole window is in the past (dense).

Because values carry RoPE at key positions, the output's rope channels are rotated back at the
query position, which leaves the value contribution depending on relative position only.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
from torch import Tensor, nn

from deepinfer.backends.base import Backend, Fp8Activation
from deepinfer.config import ModelConfig
from deepinfer.models.layers.candidate_indexer import LongRange, SharedKV
from deepinfer.models.layers.compressor import Compressor
from deepinfer.models.layers.fused import fused_outputs, pair
from deepinfer.models.layers.indexer import Indexer
from deepinfer.models.layers.norm import Linear, RMSNorm, fp32_param
from deepinfer.models.layers.rope import Rotary
from deepinfer.models.layers.visibility import visible_entries, visible_mask
from deepinfer.models.layers.window import (
    chunk_window,
    ragged_window,
    ring_rows,
    verify_window_pages,
    window_pages,
)
from deepinfer.models.layouts import (
    LayerStates,
    RaggedRows,
    SlotRows,
    compressor_states,
    memo_of,
)
from deepinfer.models.ring import SWARing
from deepinfer.models.state import LayerState
from deepinfer.paging import dense_entries


def init_mqa(module: nn.Module, cfg: ModelConfig, dtype: torch.dtype) -> int:
    """Create the per-layer parts V4 and V4.1 attention share (low-rank query path, the shared
    kv head, the grouped output projection, the sinks) under their official names; returns the
    hidden size."""
    module.n_heads = cfg.num_attention_heads
    module.head_dim = cfg.head_dim
    module.window = cfg.sliding_window
    module.groups = cfg.o_groups
    module.eps = cfg.rms_norm_eps
    d, hd = cfg.hidden_size, cfg.num_attention_heads * cfg.head_dim
    module.wq_a = Linear(d, cfg.q_lora_rank, dtype, fp8_capable=True)
    module.q_norm = RMSNorm(cfg.q_lora_rank, cfg.rms_norm_eps)
    module.wq_b = Linear(cfg.q_lora_rank, hd, dtype, fp8_capable=True)
    module.wkv = Linear(d, cfg.head_dim, dtype, fp8_capable=True)
    module.kv_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
    module.wo_a = Linear(
        hd // cfg.o_groups,
        cfg.o_groups * cfg.o_lora_rank,
        dtype,
        fp8_capable=True,
        groups=cfg.o_groups,
    )
    module.wo_b = Linear(cfg.o_groups * cfg.o_lora_rank, d, dtype, fp8_capable=True)
    module.attn_sink = fp32_param(cfg.num_attention_heads)
    return d


class MQA(nn.Module, ABC):
    """The maths V4 and V4.1 attention share around their different long-range keys."""

    #: Per-head unweighted RMSNorm of the query (always in V4; a config switch in V4.1).
    q_head_norm: bool = True
    #: Projections of the same input, run as one where the backend fuses them (:mod:`.fused`).
    FUSED_PAIRS = (("wq_a", "wkv"),)

    @abstractmethod
    def new_state(
        self, batch: int, dtype: torch.dtype, device: torch.device, slack: int = 0
    ) -> LayerState:
        """The layer's empty state: its window ring and whatever long-range state it keeps."""

    def project(  # noqa: PLR0917
        self,
        ops: Backend,
        x: Tensor,
        cos: Tensor,
        sin: Tensor,
        x_fp8: Fp8Activation | None,
        ring: tuple[Tensor, Tensor] | None = None,
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """(rotated queries [B, S, H, D], query latent ``qr``, rotated kv row [B, S, D]).
        ``x_fp8``: ``x`` quantised for FP8 projections by the norm that made it. ``ring``:
        slot rows' kv (a decode step's, a verification pass's) go straight into these rows of
        their rings ((flattened rings, rows [B] or [B, T]), :func:`~.window.ring_rows`) and
        come back as None."""
        b, s, _ = x.shape
        q_latent, kv = pair(self, "wq_a", "wkv", ops, x, x_fp8=x_fp8)
        qr, qr_fp8 = self.q_norm.feeding(ops, q_latent, self.wq_b)
        q = self.wq_b(ops, qr, qr_fp8).view(b, s, self.n_heads, self.head_dim)
        if self.q_head_norm:
            q = ops.rms_norm_rope(q, None, self.eps, cos, sin)
        else:
            q = ops.rope(q, cos, sin)
        if ring is not None:
            self.kv_norm.rotated_into(ops, kv, cos, sin, *ring)
            return q, qr, None
        return q, qr, self.kv_norm.rotated(ops, kv, cos, sin)

    def forward(
        self,
        ops: Backend,
        x: Tensor,
        positions: Tensor,
        rotary: Rotary,
        state: LayerStates,
        *,
        shared: SharedKV | None = None,
        x_fp8: Fp8Activation | None = None,
    ) -> Tensor:
        """``x`` [B, S, d] is the normed sublayer input at absolute ``positions``: [S] for a
        span, [N] for a ragged pass's spans packed in [1, N], [B, 1] for a batch of decode rows
        in shared slots. ``shared``: V4.1's per-call source-layer outputs; ``x_fp8``: ``x``
        quantised already (:meth:`~deepinfer.models.layers.norm.RMSNorm.feeding`)."""
        cos, sin = rotary.cos_sin(positions)
        ring = ring_rows(positions, state) if isinstance(state, SlotRows) else None
        q, qr, kv = self.project(ops, x, cos, sin, x_fp8, ring)
        o = self.attend(ops, x, q, qr, kv, positions, rotary, state, shared)
        return self.output(ops, o)

    def attend(  # noqa: PLR0917 - everything forward built
        self,
        ops: Backend,
        x: Tensor,
        q: Tensor,
        qr: Tensor,
        kv: Tensor | None,
        positions: Tensor,
        rotary: Rotary,
        state: LayerState | SlotRows | RaggedRows,
        shared: SharedKV | None,
    ) -> Tensor:
        """Attention output [B, S, H, D] of one sequence chunk, of a ragged pass's spans, or
        of one decode batch: the sliding window plus whatever long-range entries the layer
        kind adds; its rope channels rotated back at the query positions, since the values
        carry RoPE at their key positions.

        A chunk or ragged spans list each query's keys (window rows, then its entries) for
        sparse attention; a decode batch lists its rows' ring slots and entries, which
        attention reads where they are, and rotates its output back in the same op.
        """
        scale = self.head_dim**-0.5
        angles = rotary.cos_sin(positions)
        if isinstance(state, SlotRows) and state.tokens is None:  # decode rows
            sources = [window_pages(positions, state, self.window)]
            extra = self.long_range(ops, x, qr, positions, rotary, state, shared)
            if extra is not None:
                sources.append(extra.decode_pages())
            return ops.paged_attention(q, sources, self.attn_sink, scale, angles)
        if isinstance(state, SlotRows):  # verification rows, each query a decode row's
            b, t = q.shape[:2]
            sources = [verify_window_pages(positions, state, self.window)]
            extra = self.long_range(ops, x, qr, positions, rotary, state, shared)
            if extra is not None:
                sources.append(extra.verify_pages(state.step_memo))
            flat = (angles[0].reshape(b * t, 1, -1), angles[1].reshape(b * t, 1, -1))
            query = q.reshape(b * t, 1, *q.shape[2:])
            o = ops.paged_attention(query, sources, self.attn_sink, scale, flat)
            return o.view(b, t, *o.shape[2:])
        assert kv is not None, "slot rows write their kv rows in project()"
        if isinstance(state, RaggedRows):
            keys, index = ragged_window(kv, state, self.window)
        else:
            keys, window = chunk_window(kv, state, self.window, memo_of(state))
            index = window.expand(q.shape[0], -1, -1)
        extra = self.long_range(ops, x, qr, positions, rotary, state, shared)
        if extra is not None:
            index = torch.cat((index, extra.index(keys.shape[1])), dim=-1)
            entries = dense_entries(extra.entries).to(kv.dtype)
            if extra.span_of is not None:  # [n, T, D]: every span's, one after another
                entries = entries.flatten(0, 1)[None]
            keys = torch.cat((keys, entries), dim=1)
        o = ops.sparse_attention(q, keys, index, self.attn_sink, scale)
        return ops.rope(o, *angles, inverse=True)

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
        """The compressed entries and which of them each query sees, or None for a
        sliding-only layer."""
        return None

    def output(self, ops: Backend, o: Tensor) -> Tensor:
        """The grouped low-rank output projection of the de-rotated attention output."""
        b, s = o.shape[:2]
        o = self.wo_a.grouped(ops, o.reshape(b, s, self.groups, -1))
        return self.wo_b(ops, o.flatten(2))


#: A CSA layer's two compressors (the attention's and its indexer's) project the layer input:
#: one GEMM where the backend fuses projections, its slices handed to each compressor.
COMPRESSOR_PROJECTIONS = (
    "compressor.wkv",
    "compressor.wgate",
    "indexer.compressor.wkv",
    "indexer.compressor.wgate",
)


class Attention(MQA):
    FUSED_PAIRS = (*MQA.FUSED_PAIRS, COMPRESSOR_PROJECTIONS)

    def __init__(self, cfg: ModelConfig, layer_id: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.kind = cfg.attn_kind(layer_id)
        self.ratio = cfg.compress_ratio(layer_id)
        d = init_mqa(self, cfg, dtype)
        self.compressor: Compressor | None = None
        self.indexer: Indexer | None = None
        if self.kind != "swa":
            overlap = self.kind == "csa"
            self.compressor = Compressor(
                d, self.head_dim, self.ratio, overlap=overlap, eps=cfg.rms_norm_eps
            )
        if self.kind == "csa":
            self.indexer = Indexer(cfg, self.ratio, dtype)

    def new_state(
        self, batch: int, dtype: torch.dtype, device: torch.device, slack: int = 0
    ) -> LayerState:
        ring = torch.zeros(batch, self.window + slack, self.head_dim, dtype=dtype, device=device)
        state = LayerState(swa=SWARing(ring, window=self.window))
        if self.compressor is not None:
            state.compressor = self.compressor.new_state(batch, dtype, device, slack)
        if self.indexer is not None:
            state.indexer = self.indexer.compressor.new_state(batch, dtype, device, slack)
        return state

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
        if self.compressor is None:
            return None
        both = fused_outputs(self, COMPRESSOR_PROJECTIONS, ops, x)  # None: each its own
        own, theirs = (None, None) if both is None else (both[:2], both[2:])
        entries = self.compressor(ops, x, positions, rotary, compressor_states(state), own)
        n = entries.shape[1]
        span_of = state.meta.token_span if isinstance(state, RaggedRows) else None
        if self.indexer is not None:
            picks = self.indexer(
                ops,
                x,
                qr,
                positions,
                rotary=rotary,
                state=compressor_states(state, "indexer"),
                projected=theirs,
            )
            return LongRange(entries, picks=picks, span_of=span_of)
        memo, batch = memo_of(state), x.shape[0]
        visible = visible_mask(positions, self.ratio, n, batch, memo)
        listed = None
        if isinstance(state, SlotRows):  # decode and verification rows: read in place
            listed = visible_entries(positions, self.ratio, n, batch, state.step_memo)
        return LongRange(entries, visible=visible, span_of=span_of, listed=listed, memo=memo)
