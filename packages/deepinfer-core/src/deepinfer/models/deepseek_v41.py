"""DeepSeek-V4.1 text model on the Backend op table, with explicit state.

What differs from V4 (``deepseek_v4.py``) lives in ``layers/``: ratio-1/2 compressors owned by
KV-source layers and shared by their layer group (``shared_compressor``, ``shared_attention``),
index-source layers and the two-level candidate-block selection (``candidate_indexer``), the
lagged mHC pre-mix with no ``hc_head`` (``lagged_mhc``), and the Engram n-gram memory
(``engram``, ``engram_hash``). The three MTP layers are V4 MTP layers under ``mtp.{i}``; they are
loaded and kept for speculative decoding, which drives them elsewhere.

Images: the vision tower is not part of this model. A caller that ran it passes the aligned image
embeddings as ``image_embeds`` [N, d], one row per ``image_token_id`` in ``input_ids`` (row-major
over batch then position); they replace the token embeddings there. Image positions also skip
Engram and route experts with the image bias.

Usage::

    model = DeepseekV41ForCausalLM(cfg, dtype=torch.bfloat16)
    model.set_engram_token_map(build_compressed_token_map(tokenizer))  # Engram needs it
    state = model.new_state(batch_size=1)
    logits = model(ids[:, :37], state)               # any chunking gives the same logits
    logits = model(ids[:, 37:38], state)
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch import Tensor, nn

from deepinfer.backends.base import Backend
from deepinfer.backends.torch_ref import TorchBackend
from deepinfer.config import ModelConfig
from deepinfer.models.deepseek_v4 import (
    DeepseekV4ForCausalLM,
    LockstepGroup,
    advance_packed,
    all_slotted,
    check_ids,
    decode_inputs,
    pack_chunks,
    per_layer_states,
    step_rows,
    take_rows,
)
from deepinfer.models.graphs import DecodeGraphs
from deepinfer.models.layers.candidate_indexer import SharedKV
from deepinfer.models.layers.mhc import HyperConnection, add_hc_params
from deepinfer.models.layers.mtp import MTPBlock
from deepinfer.models.layers.norm import Embedding, Linear, RMSNorm
from deepinfer.models.layers.rope import Rotary
from deepinfer.models.layers.shared_block import SharedBlock, V41Context
from deepinfer.models.state import LayerStates, ModelState
from deepinfer.transfer import to_device

#: Checkpoint tensors of the DSpark draft head that sit next to the MTP layers. Their names are
#: not published; they are kept verbatim in ``model.draft_tensors`` instead of failing the load.
DSPARK_PREFIXES = ("dspark.",)


def _is_draft_tensor(name: str) -> bool:
    if name.startswith(DSPARK_PREFIXES):
        return True
    parts = name.split(".")
    return parts[0] == "mtp" and len(parts) > 1 and not parts[1].isdigit()


class DeepseekV41ForCausalLM(DeepseekV4ForCausalLM):
    def __init__(
        self,
        cfg: ModelConfig,
        dtype: torch.dtype = torch.bfloat16,
        device: str | torch.device = "cpu",
        backend: Backend | None = None,
    ) -> None:
        nn.Module.__init__(self)  # the module tree differs from V4's; only methods are shared
        if not cfg.is_v41:
            raise ValueError(f"model_type={cfg.model_type!r} is not a DeepSeek-V4.1 config")
        device = torch.device(device)
        self.cfg = cfg
        self.dtype = dtype
        if backend is None:
            backend = TorchBackend("cpu" if device.type == "meta" else device)
        self.ops: Backend = backend
        d = cfg.hidden_size
        with device:
            self.embed = Embedding(cfg.vocab_size, d, dtype)
            self.layers = nn.ModuleList(
                SharedBlock(cfg, i, dtype) for i in range(cfg.num_hidden_layers)
            )
            self.norm = RMSNorm(d, cfg.rms_norm_eps)
            if not cfg.hc_pre_from_prev_sublayer:
                add_hc_params(self, "hc_head", cfg, head=True)
            self.head = Linear(d, cfg.vocab_size, torch.float32)
            self.mtp = nn.ModuleList(
                MTPBlock(cfg, cfg.num_hidden_layers + i, dtype)
                for i in range(cfg.num_nextn_predict_layers)
            )
        rope_dim = cfg.qk_rope_head_dim
        self.rotary = {
            "main": Rotary.build(rope_dim, cfg.rope_theta, None, device),
            "compress": Rotary.build(rope_dim, cfg.compress_rope_theta, cfg.rope_scaling, device),
        }
        self.engram_history = max(cfg.engram_max_ngram_size - 1, 0) if cfg.engram_layer_ids else 0
        self.engram_token_map: Tensor | None = None
        self.draft_tensors: dict[str, Tensor] = {}

    # -- Engram token map -------------------------------------------------------------------------

    def set_engram_token_map(self, token_map: Tensor) -> None:
        """Raw token id -> compressed id (``build_compressed_token_map(tokenizer)``).

        A tokenizer can be shorter than the padded embedding table; ids past its end never
        occur in real input and map like the pad token.
        """
        token_map = torch.as_tensor(token_map, dtype=torch.long)
        vocab, pad = self.cfg.vocab_size, self.cfg.engram_pad_token_id
        if token_map.dim() != 1 or not pad < token_map.numel() <= vocab:
            raise ValueError(
                f"the token map must be 1-D with {pad + 1}..{vocab} entries, got "
                f"{tuple(token_map.shape)}"
            )
        top = int(token_map.max())
        if token_map.min() < 0 or top >= self.cfg.engram_compressed_vocab_size:
            raise ValueError(
                f"compressed ids must lie in [0, {self.cfg.engram_compressed_vocab_size}), "
                f"got max {top}"
            )
        tail = token_map.new_full((vocab - token_map.numel(),), int(token_map[pad]))
        self.engram_token_map = torch.cat((token_map, tail)).to(self.device)

    # -- state ------------------------------------------------------------------------------------

    def new_state(self, batch_size: int = 1, slack: int = 0) -> ModelState:
        state = super().new_state(batch_size, slack)
        if self.engram_history:
            state.token_history = torch.full(
                (batch_size, self.engram_history),
                self.cfg.engram_pad_token_id,
                dtype=torch.long,
                device=self.device,
            )
        return state

    def rollback(self, state: ModelState, length: int, token_ids: Sequence[int] = ()) -> None:
        history: Tensor | None = None
        if self.engram_history and 0 <= length < state.pos:
            if len(token_ids) < length:
                raise ValueError(
                    f"rolling back a V4.1 state needs the sequence's token ids (at least {length}) "
                    "to rebuild the Engram history"
                )
            h = self.engram_history
            recent = list(token_ids[max(0, length - h) : length])
            recent = [self.cfg.engram_pad_token_id] * (h - len(recent)) + recent
            history = to_device(torch.tensor([recent] * state.batch_size), self.device)
        super().rollback(state, length, token_ids)
        if history is not None:
            state.token_history = history

    # -- forward ----------------------------------------------------------------------------------

    @torch.no_grad()
    def forward(  # type: ignore[override]
        self, input_ids: Tensor, state: ModelState, image_embeds: Tensor | None = None
    ) -> Tensor:
        """Advance ``state`` by ``input_ids`` [B, S]; returns fp32 logits [B, S, V]."""
        return self.forward_with_streams(input_ids, state, image_embeds)[0]

    def _embed(self, input_ids: Tensor, image_embeds: Tensor | None) -> tuple[Tensor, Tensor]:
        e = self.embed(input_ids)
        image_id = self.cfg.image_token_id
        is_image = (
            input_ids == image_id if image_id is not None else torch.zeros_like(input_ids).bool()
        )
        n_images = int(is_image.sum())
        if image_embeds is None:
            if n_images and self.cfg.image_token_id is not None:
                raise ValueError(
                    f"input_ids hold {n_images} image tokens ({image_id}) but no image_embeds "
                    "were given (the vision tower runs outside this model)"
                )
            return e, is_image
        if tuple(image_embeds.shape) != (n_images, e.shape[-1]):
            raise ValueError(
                f"image_embeds must be [{n_images}, {e.shape[-1]}] (one row per image token), "
                f"got {tuple(image_embeds.shape)}"
            )
        e = e.clone()
        e[is_image] = image_embeds.to(device=e.device, dtype=e.dtype)
        return e, is_image

    def _engram_ids(
        self, input_ids: Tensor, history: Tensor | None
    ) -> tuple[Tensor | None, Tensor | None]:
        """(compressed ids with the look-back in front, the new look-back) for ``input_ids``."""
        if not self.engram_history:
            return None, history
        assert history is not None and self.engram_token_map is not None
        raw = torch.cat((history, input_ids), dim=1)
        return self.engram_token_map[raw], raw[:, -self.engram_history :].clone()

    @torch.no_grad()
    def forward_with_streams(  # type: ignore[override]
        self, input_ids: Tensor, state: ModelState, image_embeds: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """Like :meth:`forward`, plus the final residual streams [B, S, hc_mult, d]."""
        return self._forward_streams(input_ids, state, image_embeds)

    def _forward_streams(  # type: ignore[override]
        self, input_ids: Tensor, state: ModelState, image_embeds: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """The undecorated body (see :meth:`DeepseekV4ForCausalLM.forward_train`)."""
        check_ids(input_ids, state)
        self._check_engram()
        input_ids = to_device(input_ids, self.device)
        positions = torch.arange(state.pos, state.pos + input_ids.shape[1], device=self.device)
        engram_ids, state.token_history = self._engram_ids(input_ids, state.token_history)
        out = self._run_v41(input_ids, positions, engram_ids, state.layers, image_embeds)
        state.pos += input_ids.shape[1]
        return out

    @torch.no_grad()
    def forward_decode(
        self,
        input_ids: Tensor,
        states: Sequence[ModelState],
        graphs: DecodeGraphs | None = None,
    ) -> Tensor:
        """One new (text) token per sequence at its own position; see the V4 method."""
        self._check_engram()
        image_id = self.cfg.image_token_id
        # Ids already on an accelerator come from the engine's sampler, which never draws the
        # image token; checking them would wait for the step that drew them.
        on_host = input_ids.device.type == "cpu"
        if image_id is not None and on_host and bool((input_ids == image_id).any()):
            raise ValueError("forward_decode takes text tokens; images go through forward")
        ids, positions = decode_inputs(input_ids, states, self.device)
        pool = states[0].history_pool
        if all_slotted(states) and (not self.engram_history or pool is not None):
            return self._decode_slots(ids, positions, states, graphs)
        history = None
        if self.engram_history:
            history = torch.cat([s.token_history for s in states])  # type: ignore[misc]
        engram_ids, new_history = self._engram_ids(ids, history)
        logits, _ = self._run_v41(
            ids, positions, engram_ids, per_layer_states(states), None, graphs=graphs, text=True
        )
        for i, s in enumerate(states):
            s.pos += 1
            if new_history is not None:
                s.token_history = new_history[i : i + 1]
        return logits[:, 0]

    def _decode_slots(
        self,
        ids: Tensor,
        positions: Tensor,
        states: Sequence[ModelState],
        graphs: DecodeGraphs | None,
    ) -> Tensor:
        """Decode rows whose whole state, Engram history included, lives in shared slots."""
        template = states[0].layers
        pool = states[0].history_pool

        def step(ids: Tensor, positions: Tensor, slots: Tensor, num_tokens: int) -> Tensor:
            history = pool.index_select(0, slots) if pool is not None else None
            engram_ids, new_history = self._engram_ids(ids, history)
            if pool is not None and new_history is not None:
                pool[slots] = new_history
            rows = step_rows(template, slots, num_tokens)
            logits, _ = self._run_v41(ids, positions, engram_ids, rows, None, text=True)
            return logits[:, 0]

        extra = () if pool is None else (pool,)
        return self._slot_step(step, ids, positions, states, graphs, extra)

    @torch.no_grad()
    def forward_packed_at(
        self,
        chunks: Sequence[Tensor],
        states: Sequence[ModelState],
        marks: Sequence[Sequence[int]] | None = None,
    ) -> tuple[Tensor, list[list[ModelState]]]:
        """Text chunks of several sequences in one packed pass; see the V4 method."""
        self._check_engram()
        image_id = self.cfg.image_token_id
        # Checked where the chunks are (the engine's are on the host: no device sync), so the
        # forward itself skips the image mask.
        if image_id is not None and any(bool((c == image_id).any()) for c in chunks):
            raise ValueError("forward_packed takes text chunks; images go through forward")
        return super().forward_packed_at(chunks, states, marks)

    def _forward_items(
        self,
        groups: Sequence[LockstepGroup],
        chunks: Sequence[Tensor],
        states: Sequence[ModelState],
    ) -> Tensor:
        ids, positions, packed, last = pack_chunks(chunks, states, self.device, groups)
        engram_ids: list[Tensor] | None = None
        if self.engram_history:  # one [1, history + S] row per group row, then per span
            engram_ids = []
            for g in groups:
                rows, g.batch.token_history = self._engram_ids(g.ids, g.batch.token_history)
                assert rows is not None
                engram_ids += list(rows.split(1))
            for chunk, s in zip(chunks, states, strict=True):
                span_ids, s.token_history = self._engram_ids(
                    to_device(chunk.reshape(1, -1), self.device), s.token_history
                )
                assert span_ids is not None
                engram_ids.append(span_ids)
        logits, _ = self._run_v41(
            ids,
            positions,
            engram_ids,
            packed,
            None,
            shared=[SharedKV() for _ in packed[0].states],
            rows=last,
            text=True,
        )
        advance_packed(groups, chunks, states)
        return logits[0]

    def _check_engram(self) -> None:
        if self.engram_history and self.engram_token_map is None:
            raise ValueError(
                "this model has Engram layers but no compressed token map: call "
                "model.set_engram_token_map(build_compressed_token_map(tokenizer)) first"
            )

    def _run_v41(
        self,
        input_ids: Tensor,
        positions: Tensor,
        engram_ids: Tensor | list[Tensor] | None,
        layer_states: Sequence[LayerStates],
        image_embeds: Tensor | None,
        *,
        shared: list[SharedKV] | None = None,
        rows: Tensor | None = None,
        graphs: DecodeGraphs | None = None,
        text: bool = False,
    ) -> tuple[Tensor, Tensor]:
        """(logits, final streams); ``rows`` limits the logits to those positions (see
        :func:`~deepinfer.models.deepseek_v4.take_rows`).
        ``text``: the caller checked that no id is an image token (no device-side check)."""
        if text:
            e, image_mask = self.embed(input_ids), None
        else:
            e, is_image = self._embed(input_ids, image_embeds)
            image_mask = is_image if bool(is_image.any()) else None
        ctx = V41Context(
            ops=self.ops,
            positions=positions,
            input_ids=input_ids,
            rotary=self.rotary,
            shared=SharedKV() if shared is None else shared,
            image_mask=image_mask,
            engram_ids=engram_ids,
            engram_history=self.engram_history,
            graphs=graphs,
        )
        x = e[:, :, None, :].expand(-1, -1, self.cfg.hc_mult, -1).contiguous()
        pre: Tensor | None = None
        for layer, layer_state in zip(self.layers, layer_states, strict=True):
            x, pre = layer(x, pre, ctx, layer_state)
        last = take_rows(x, rows)
        if pre is None:  # V4-style residual (hc_pre_from_prev_sublayer off)
            h = HyperConnection(self, "hc_head", self.cfg).head(self.ops, last)
        else:
            h = self.ops.mhc_collapse(last, take_rows(pre, rows))
        return self._logits(h), x

    @torch.no_grad()
    def forward_logits(  # type: ignore[override]
        self, input_ids: Tensor, chunk_size: int = 4096, image_embeds: Tensor | None = None
    ) -> Tensor:
        """Full-sequence logits [B, S, V] (fp32) with no state kept after the call."""
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        state = self.new_state(input_ids.shape[0])
        chunks = []
        used = 0
        for i in range(0, input_ids.shape[1], chunk_size):
            ids = input_ids[:, i : i + chunk_size]
            part = None
            if image_embeds is not None:
                image_id = self.cfg.image_token_id
                n = 0 if image_id is None else int((ids == image_id).sum())
                part, used = image_embeds[used : used + n], used + n
            chunks.append(self.forward(ids, state, part))
        return torch.cat(chunks, dim=1)

    def mtp_forward(
        self, streams: Tensor, next_ids: Tensor, state: ModelState, depth: int = 0
    ) -> tuple[Tensor, Tensor]:
        self._require_mtp()
        raise NotImplementedError(
            "V4.1 MTP/DSpark drafting: the MTP layers are loaded, but how V4.1 feeds them (which "
            "streams, DSpark's target-layer features and heads) is not implemented"
        )

    # -- weights ----------------------------------------------------------------------------------

    @torch.no_grad()
    def load_state(self, tensors: Iterable[tuple[str, Tensor]]) -> None:
        """Strict like V4, except DSpark head tensors, which are kept in ``draft_tensors``."""
        self.draft_tensors = {}

        def strict() -> Iterable[tuple[str, Tensor]]:
            for name, tensor in tensors:
                if _is_draft_tensor(name):
                    self.draft_tensors[name] = tensor
                else:
                    yield name, tensor

        super().load_state(strict())
