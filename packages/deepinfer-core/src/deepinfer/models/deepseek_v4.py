"""DeepSeek-V4: the full model on the Backend op table, with explicit state.

Module attribute names are the official checkpoint names (``embed.weight``,
``layers.3.attn.compressor.ape``, ``layers.0.ffn.gate.tid2eid``, ``mtp.0.e_proj.weight``, ...), so
loading is a strict name-for-name copy of what the checkpoint reader yields.

Usage::

    model = DeepseekV4ForCausalLM(cfg, dtype=torch.bfloat16, device="cuda")
    logits = model.forward_logits(ids)              # whole sequence, no state kept
    state = model.new_state(batch_size=1)
    logits = model(ids[:, :37], state)              # any chunking gives the same logits
    logits = model(ids[:, 37:38], state)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from deepinfer.backends.base import Backend
from deepinfer.backends.torch_ref import TorchBackend
from deepinfer.cache.pages import PAGE_TOKENS, pages_for
from deepinfer.config import ModelConfig
from deepinfer.models.errors import CheckpointError
from deepinfer.models.graphs import DecodeGraphs, entry_bucket
from deepinfer.models.layers.block import Block, ForwardContext
from deepinfer.models.layers.mhc import HyperConnection, add_hc_params
from deepinfer.models.layers.mtp import MTPBlock
from deepinfer.models.layers.norm import Embedding, Linear, RMSNorm
from deepinfer.models.layers.rope import Rotary
from deepinfer.models.rollback import rollback_layers
from deepinfer.models.state import (
    CompressorRows,
    CompressorState,
    LayerState,
    LayerStates,
    ModelState,
    Packed,
    SlotRows,
    StepMemo,
    clear_marks,
    clone_or_none,
    entry_bytes_per_token,
    gather_rows,
    page_table_of,
    scatter_rows,
    select_row,
    set_marks,
    states_at,
)
from deepinfer.transfer import to_device

#: A decode step over slot rows: (ids [B, 1], positions [B, 1], slots [B], tokens whose entries
#: it reads: the batch's longest sequence, or an entry bucket when captured) -> logits [B, V].
SlotStep = Callable[[Tensor, Tensor, Tensor, int], Tensor]


class DeepseekV4ForCausalLM(nn.Module):
    #: How much padding :meth:`forward_packed` may add to run chunks of different lengths as
    #: one lockstep batch (see :data:`MAX_PADDING`); None: that on an accelerator, none on
    #: the CPU. With none, only fresh prompts form groups.
    prefill_padding: float | None = None

    def __init__(
        self,
        cfg: ModelConfig,
        dtype: torch.dtype = torch.bfloat16,
        device: str | torch.device = "cpu",
        backend: Backend | None = None,
    ) -> None:
        super().__init__()
        device = torch.device(device)
        self.cfg = cfg
        self.dtype = dtype
        if backend is None:
            # A meta-device model (shape planning, parameter counts) never runs ops.
            backend = TorchBackend("cpu" if device.type == "meta" else device)
        self.ops: Backend = backend
        d = cfg.hidden_size
        with device:
            self.embed = Embedding(cfg.vocab_size, d, dtype)
            self.layers = nn.ModuleList(Block(cfg, i, dtype) for i in range(cfg.num_hidden_layers))
            self.norm = RMSNorm(d, cfg.rms_norm_eps)
            add_hc_params(self, "hc_head", cfg, head=True)
            # Logits are computed in fp32, so the head is kept in fp32.
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

    @property
    def device(self) -> torch.device:
        return self.embed.weight.device

    @property
    def has_mtp(self) -> bool:
        """Whether MTP layers were loaded; checkpoints saved by other tools often drop them."""
        return len(self.mtp) > 0

    def _require_mtp(self) -> None:
        """Fail a drafting entry point with the reason, rather than an IndexError on ``mtp``."""
        if not self.has_mtp:
            raise CheckpointError(
                "this checkpoint has no MTP weights (num_nextn_predict_layers=0 or no mtp.* "
                "tensors): MTP drafting is unavailable, the main model works as usual"
            )

    # -- state ------------------------------------------------------------------------------------

    def new_state(self, batch_size: int = 1, slack: int = 0) -> ModelState:
        """Fresh per-sequence state (SWA rings, compressor buffers, compressed entries).

        ``slack`` > 0 lets :meth:`rollback` take back up to that many tokens (speculative
        decoding): the rings keep ``slack`` extra rows and the compressors their recent inputs.
        """
        if slack < 0:
            raise ValueError(f"slack must be >= 0, got {slack}")
        dev, dt = self.device, self.dtype
        return ModelState(
            layers=[layer.new_state(batch_size, dt, dev, slack) for layer in self.layers],
            mtp=[block.new_state(batch_size, dt, dev, slack) for block in self.mtp],
            slack=slack,
        )

    def rollback(self, state: ModelState, length: int, token_ids: Sequence[int] = ()) -> None:
        """Take ``state`` back to its first ``length`` tokens, exactly as if the later ones had
        never run (at most ``state.slack`` tokens back). ``token_ids``: the sequence's tokens,
        needed by models that hash recent ids (V4.1 Engram)."""
        rollback_layers(state, length)

    def _context(self, input_ids: Tensor, start: int) -> ForwardContext:
        positions = torch.arange(start, start + input_ids.shape[1], device=input_ids.device)
        return ForwardContext(self.ops, positions, input_ids, self.rotary)

    # -- forward ----------------------------------------------------------------------------------

    @torch.no_grad()
    def forward(self, input_ids: Tensor, state: ModelState) -> Tensor:
        """Advance ``state`` by ``input_ids`` [B, S]; returns fp32 logits [B, S, V]."""
        return self.forward_with_streams(input_ids, state)[0]

    @torch.no_grad()
    def forward_with_streams(self, input_ids: Tensor, state: ModelState) -> tuple[Tensor, Tensor]:
        """Like :meth:`forward`, plus the pre-``hc_head`` residual streams [B, S, hc_mult, d]
        that the MTP layers read."""
        return self._forward_streams(input_ids, state)

    def _forward_streams(self, input_ids: Tensor, state: ModelState) -> tuple[Tensor, Tensor]:
        """The body of :meth:`forward_with_streams`, without the ``no_grad`` that inference
        wants, so :meth:`forward_train` runs exactly the same code with autograd on."""
        check_ids(input_ids, state)
        input_ids = input_ids.to(self.device)
        ctx = self._context(input_ids, state.pos)
        logits, x = self._run_layers(input_ids, ctx, state.layers)
        state.pos += input_ids.shape[1]
        return logits, x

    def _run_layers(
        self,
        input_ids: Tensor,
        ctx: ForwardContext,
        layer_states: Sequence[LayerStates],
        rows: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """(logits, final streams); ``rows`` limits the logits to those positions (see
        :func:`take_rows`)."""
        e = self.embed(input_ids)
        x = e[:, :, None, :].expand(-1, -1, self.cfg.hc_mult, -1).contiguous()
        for layer, layer_state in zip(self.layers, layer_states, strict=True):
            x = layer(x, ctx, layer_state)
        last = take_rows(x, rows)
        logits = self._logits(HyperConnection(self, "hc_head", self.cfg).head(self.ops, last))
        return logits, x

    @torch.no_grad()
    def forward_decode(
        self,
        input_ids: Tensor,
        states: Sequence[ModelState],
        graphs: DecodeGraphs | None = None,
    ) -> Tensor:
        """One new token for each of several sequences at their own positions.

        ``input_ids`` [B] (or [B, 1]), ``states`` B single-sequence states. Returns fp32 logits
        [B, V] and advances every state by one token, as B separate ``forward`` calls would,
        but with one batched pass through the layers (continuous-batching decode). States in
        shared slot tensors (:class:`~deepinfer.cache.slots.StateSlots` with entries) decode
        with a few indexed ops per layer and no per-row host work. ``graphs`` (on a GPU; see
        :mod:`.graphs`): replay such a step whole, otherwise each layer's FFN half.
        """
        ids, positions = decode_inputs(input_ids, states, self.device)
        if all_slotted(states):
            return self._decode_slots(ids, positions, states, graphs)
        ctx = ForwardContext(self.ops, positions, ids, self.rotary, graphs)
        logits, _ = self._run_layers(ids, ctx, per_layer_states(states))
        for s in states:
            s.pos += 1
        return logits[:, 0]

    def _decode_slots(
        self,
        ids: Tensor,
        positions: Tensor,
        states: Sequence[ModelState],
        graphs: DecodeGraphs | None,
    ) -> Tensor:
        """Decode rows whose whole state lives in shared slot tensors."""
        template = states[0].layers

        def step(ids: Tensor, positions: Tensor, slots: Tensor, num_tokens: int) -> Tensor:
            rows = step_rows(template, slots, num_tokens)
            ctx = ForwardContext(self.ops, positions, ids, self.rotary)
            return self._run_layers(ids, ctx, rows)[0][:, 0]

        return self._slot_step(step, ids, positions, states, graphs)

    def _slot_step(  # noqa: PLR0917
        self,
        step: SlotStep,
        ids: Tensor,
        positions: Tensor,
        states: Sequence[ModelState],
        graphs: DecodeGraphs | None,
        extra: Sequence[Tensor] = (),
    ) -> Tensor:
        """Run a decode ``step`` over slot rows and advance the states' host counters.

        The step is a fixed sequence of device ops over the slot tensors (and ``extra``,
        further shared tensors it reads or writes), so on a GPU it is captured whole, once per
        batch bucket and entry bucket: it reads the entries of ``num_tokens`` tokens, the
        batch's longest rounded up to a bucket of pages (eagerly: the longest itself).
        """
        slots = slot_ids(states, self.device)
        found = page_table_of(states[0])
        if found is not None:  # the step writes each row's next entry by index: hold its page
            for s in states:
                found[0].ensure(s.layers[0].swa.slot, s.pos + 1)
        num_tokens = max(s.pos for s in states) + 1
        if graphs is not None and self.ops.supports_cuda_graphs(self.dtype):
            pages = 0  # no compressed layers: no entries to read
            if found is not None:
                pages = entry_bucket(pages_for(num_tokens), found[0].pages_per_slot)
            num_tokens = pages * PAGE_TOKENS
            # The graph bakes in the shared tensors' addresses, which change if they grow.
            shared = (*slot_tensors(states[0].layers), *extra)
            key = ("step", num_tokens, *(t.data_ptr() for t in shared))
            fn = lambda *a: (step(*a, num_tokens),)  # noqa: E731
            logits = graphs.run(key, fn, ids, positions, slots)[0]
        else:
            logits = step(ids, positions, slots, num_tokens)
        for s in states:
            s.pos += 1
            advance_slotted(s)
        return logits

    @torch.no_grad()
    def forward_packed(self, chunks: Sequence[Tensor], states: Sequence[ModelState]) -> Tensor:
        """Advance several sequences by a chunk each in one packed pass; returns the fp32
        logits of each chunk's last token [len(chunks), V].

        Token-wise work runs once over all tokens, attention per chunk with its own state, so
        prefill of many requests costs about one long forward, not one forward per request.
        Sequences at one position with chunks of similar length go further: they run as
        one lockstep chunk, whose attention is batched too (:func:`lockstep_groups`); on the
        CPU (see :attr:`prefill_padding`) only fresh prompts of one length do.
        """
        return self.forward_packed_at(chunks, states)[0]

    @torch.no_grad()
    def forward_packed_at(
        self,
        chunks: Sequence[Tensor],
        states: Sequence[ModelState],
        marks: Sequence[Sequence[int]] | None = None,
    ) -> tuple[Tensor, list[list[ModelState]]]:
        """:meth:`forward_packed`, plus each sequence's state as it stood after each length in
        ``marks[i]`` (lengths strictly inside chunk i, ascending): read-only views a prefix
        cache can snapshot, so recording its block boundaries needs no cut in the chunk."""
        if not chunks or len(chunks) != len(states):
            raise ValueError(f"forward_packed got {len(chunks)} chunks for {len(states)} states")
        marks = [list(m) for m in marks] if marks is not None else [[] for _ in chunks]
        for chunk, s, lengths in zip(chunks, states, marks, strict=True):
            if any(not s.pos < m < s.pos + chunk.numel() for m in lengths):
                raise ValueError(f"marks {lengths} are not inside the chunk after {s.pos} tokens")
        starts = [s.pos for s in states]
        views: list[list[ModelState]] = [[] for _ in chunks]
        padding = self.prefill_padding
        if padding is None:
            padding = MAX_PADDING if self.device.type != "cpu" else 0.0
        # Continuing sequences join groups only where padding pays (an accelerator). On the
        # 2-core CPU it does not (tiny model, 32 suffixes of 64 tokens after a 1024-token
        # prefix: 1.00 s span by span, 1.03 s as one lockstep chunk; 8 fresh prompts of
        # 256-512 tokens: 0.99 s as spans, 1.22 s padded to one group).
        groups = lockstep_groups(chunks, states, padding, continuing=padding > 0)
        grouped = {i for g in groups for i in g}
        # The Engram history before the chunk, where a state inside it must be rebuilt (a
        # mark, a padded group row): the forward overwrites the sequence's own.
        history = [
            clone_or_none(s.token_history) if marks[i] or i in grouped else None
            for i, s in enumerate(states)
        ]
        # Groups and the remaining spans run in one packed pass: token-wise work once for all.
        batches = [
            self._lockstep_batch(
                [chunks[i] for i in g], [states[i] for i in g], [marks[i] for i in g]
            )
            for g in groups
        ]
        rest = [i for i in range(len(chunks)) if i not in grouped]
        for i in rest:
            set_marks(states[i], marks[i])
        try:
            logits = self._forward_items(
                batches, [chunks[i] for i in rest], [states[i] for i in rest]
            )
            for i in rest:
                views[i] = states_at(states[i], states[i], marks[i])
        finally:
            for i in rest:
                clear_marks(states[i])
        order = [i for g in groups for i in g] + rest  # the logits' rows
        out = logits
        if groups:
            out = torch.empty_like(logits)
            out[to_device(torch.tensor(order), self.device)] = logits
        for group, lockstep in zip(groups, batches, strict=True):
            group_views = self._land_group(
                lockstep.batch,
                [chunks[i] for i in group],
                [states[i] for i in group],
                [marks[i] for i in group],
                [history[i] for i in group],
            )
            for i, v in zip(group, group_views, strict=True):
                views[i] = v
        for i, (chunk, before) in enumerate(zip(chunks, history, strict=True)):
            for view in views[i]:
                view.token_history = self._history_at(before, chunk, view.pos - starts[i])
        return out, views

    def _history_at(self, before: Tensor | None, chunk: Tensor, n: int) -> Tensor | None:
        """The Engram history (the last ids, oldest first) after the first ``n`` ids of
        ``chunk``, from the history ``before`` it; None for a model without one."""
        if before is None:
            return None
        ids = to_device(chunk.reshape(1, -1)[:, :n], self.device)
        return torch.cat((before, ids), dim=1)[:, -before.shape[1] :]

    def _lockstep_batch(
        self,
        chunks: Sequence[Tensor],
        states: Sequence[ModelState],
        marks: Sequence[Sequence[int]],
    ) -> LockstepGroup:
        """Sequences at one position as rows of one lockstep batch: their chunks as ids
        [G, S], padded at the end to the longest, and the batch state, loaded with their
        states and recording every member's ``marks``.

        Padding changes no real token (attention is causal), only the batch state past each
        chunk's end, so the state is built with that much rollback slack and each row is
        rolled back to its own length before it lands in its sequence's state
        (:meth:`_land_group`).
        """
        lengths = [int(c.numel()) for c in chunks]
        longest = max(lengths)
        rows = [
            torch.cat((c.reshape(-1), c.reshape(-1)[-1:].expand(longest - n)))
            for c, n in zip(chunks, lengths, strict=True)
        ]
        ids = to_device(torch.stack(rows), self.device)
        batch = self.new_state(len(chunks), slack=longest - min(lengths))
        check_ids(ids, batch)
        if states[0].pos:
            gather_rows(states, batch)
        set_marks(batch, sorted({m for lengths_j in marks for m in lengths_j}))
        batch.pos = states[0].pos
        return LockstepGroup(ids, batch, lengths)

    def _land_group(
        self,
        batch: ModelState,
        chunks: Sequence[Tensor],
        states: Sequence[ModelState],
        marks: Sequence[Sequence[int]],
        history: Sequence[Tensor | None],
    ) -> list[list[ModelState]]:
        """Put each row of a lockstep batch that ran its chunk into its sequence's state
        (rolled back to the row's own length) and return each one's states at its ``marks``;
        ``history``: each one's Engram history before the chunk."""
        lengths = [int(c.numel()) for c in chunks]
        start = states[0].pos
        if batch.slack == 0:
            scatter_rows(batch, states)
        else:
            for j, (chunk, n, dst) in enumerate(zip(chunks, lengths, states, strict=True)):
                row = select_row(batch, j)
                rollback_layers(row, start + n)
                row.token_history = self._history_at(history[j], chunk, n)
                scatter_rows(row, [dst])
        return [
            states_at(batch, dst, m, row=j)
            for j, (dst, m) in enumerate(zip(states, marks, strict=True))
        ]

    def _forward_items(
        self,
        groups: Sequence[LockstepGroup],
        chunks: Sequence[Tensor],
        states: Sequence[ModelState],
    ) -> Tensor:
        """The packed pass over lockstep groups and single-sequence spans: fp32 logits of
        each group row's and then each span's last token."""
        ids, positions, packed, last = pack_chunks(chunks, states, self.device, groups)
        ctx = ForwardContext(self.ops, positions, ids, self.rotary)
        logits, _ = self._run_layers(ids, ctx, packed, rows=last)
        advance_packed(groups, chunks, states)
        return logits[0]

    # -- training ---------------------------------------------------------------------------------

    def forward_train(self, input_ids: Tensor) -> Tensor:
        """Full-sequence logits [B, S, V] (fp32) with autograd enabled, from a fresh state.

        Inference runs under ``no_grad``; training needs gradients through the very same maths,
        so this calls the undecorated body of :meth:`forward_with_streams`. Parameters are
        created with ``requires_grad=False``; a trainer switches on the ones it optimises.
        Selections (top-k routing, indexer picks) pass no gradient, as in any MoE/sparse model.
        """
        return self.forward_train_mtp(input_ids, with_mtp=False)[0]

    def forward_train_mtp(
        self, input_ids: Tensor, with_mtp: bool = True
    ) -> tuple[Tensor, list[Tensor]]:
        """:meth:`forward_train` plus the MTP layers' logits, for a joint training loss.

        Returns (logits [B, S, V], one [B, S - 1 - k, V] tensor per MTP depth k). Depth k's row t
        predicts token ``t + 2 + k`` from the main streams at t (chained through the earlier
        depths' output streams) and the embedding of token ``t + 1 + k``, the way
        :meth:`mtp_forward` feeds them at decode time.
        """
        if with_mtp:
            self._require_mtp()
        with torch.enable_grad():
            state = self.new_state(input_ids.shape[0])
            logits, streams = self._forward_streams(input_ids, state)
            if not with_mtp:
                return logits, []
            input_ids = input_ids.to(self.device)
            out: list[Tensor] = []
            h, nxt = streams[:, :-1], input_ids[:, 1:]
            for block in self.mtp:
                if nxt.shape[1] == 0:
                    break
                block_state = block.new_state(input_ids.shape[0], self.dtype, self.device)
                ctx = self._context(nxt, 0)
                hidden, h = block.predict(h, self.embed(nxt), ctx, block_state)
                out.append(self.ops.linear(hidden, self.head.weight))
                h, nxt = h[:, :-1], nxt[:, 1:]
            return logits, out

    def _logits(self, h: Tensor) -> Tensor:
        h = self.norm(self.ops, h.float())
        return self.ops.linear(h, self.head.weight)

    @torch.no_grad()
    def forward_logits(self, input_ids: Tensor, chunk_size: int = 4096) -> Tensor:
        """Full-sequence logits [B, S, V] (fp32) with no state kept after the call.

        Long inputs run as a chunked prefill of ``chunk_size`` tokens, which gives the same
        logits while bounding the attention masks and activations to one chunk.
        """
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        state = self.new_state(input_ids.shape[0])
        chunks = [
            self.forward(input_ids[:, i : i + chunk_size], state)
            for i in range(0, input_ids.shape[1], chunk_size)
        ]
        return torch.cat(chunks, dim=1)

    @torch.no_grad()
    def mtp_forward(
        self, streams: Tensor, next_ids: Tensor, state: ModelState, depth: int = 0
    ) -> tuple[Tensor, Tensor]:
        """Draft logits for token t+2 from the main streams at t and token t+1.

        ``streams`` [B, S, hc_mult, d] come from :meth:`forward_with_streams` and
        ``next_ids`` [B, S] are the tokens one position later. The MTP layer runs at the
        positions of ``streams`` and keeps its own state (``state.mtp[depth]``, position
        ``state.mtp_pos``). Returns (logits [B, S, V] fp32, the MTP layer's output streams).
        """
        self._require_mtp()
        next_ids = next_ids.to(self.device)
        ctx = self._context(next_ids, state.mtp_pos)
        hidden, out_streams = self.mtp[depth].predict(
            streams, self.embed(next_ids), ctx, state.mtp[depth]
        )
        if depth == len(self.mtp) - 1:
            state.mtp_pos += next_ids.shape[1]
        return self.ops.linear(hidden, self.head.weight), out_streams

    # -- weights ----------------------------------------------------------------------------------

    def expected_tensors(self) -> dict[str, Tensor]:
        """Official tensor name -> the parameter or buffer it fills."""
        return dict(self.state_dict(keep_vars=True))

    @torch.no_grad()
    def load_state(self, tensors: Iterable[tuple[str, Tensor]]) -> None:
        """Copy (official name, tensor) pairs into the model; strict about names and shapes.

        Tensors are copied as they arrive so a streamed checkpoint never sits in memory twice.
        Raises :class:`CheckpointError` naming the tensor and the expected shape and dtype.
        """
        expected = self.expected_tensors()
        seen: set[str] = set()
        for name, tensor in tensors:
            target = expected.get(name)
            if target is None:
                raise CheckpointError(
                    f"unexpected tensor {name!r} {tuple(tensor.shape)} {tensor.dtype}: the model "
                    f"(V4, {self.cfg.num_hidden_layers} layers, "
                    f"{self.cfg.num_nextn_predict_layers} MTP) has no such parameter"
                )
            if name in seen:
                raise CheckpointError(f"tensor {name!r} appears twice in the checkpoint")
            if tuple(tensor.shape) != tuple(target.shape):
                raise CheckpointError(
                    f"tensor {name!r} has shape {tuple(tensor.shape)}, expected "
                    f"{tuple(target.shape)} ({target.dtype})"
                )
            if tensor.is_floating_point() != target.is_floating_point():
                raise CheckpointError(
                    f"tensor {name!r} has dtype {tensor.dtype}, expected {target.dtype} "
                    f"{tuple(target.shape)}"
                )
            target.copy_(tensor)
            seen.add(name)
        missing = [n for n in expected if n not in seen]
        if missing:
            listed = ", ".join(
                f"{n} {tuple(expected[n].shape)} {expected[n].dtype}" for n in missing[:8]
            )
            more = f" and {len(missing) - 8} more" if len(missing) > 8 else ""
            raise CheckpointError(f"checkpoint is missing {len(missing)} tensors: {listed}{more}")


def check_ids(input_ids: Tensor, state: ModelState) -> None:
    if input_ids.dim() != 2 or input_ids.shape[1] == 0:
        raise ValueError(
            f"input_ids must be [batch, seq] with seq >= 1, got shape {tuple(input_ids.shape)}"
        )
    if input_ids.shape[0] != state.batch_size:
        raise ValueError(
            f"input_ids has batch {input_ids.shape[0]} but the state was built for "
            f"{state.batch_size}"
        )


def decode_inputs(
    input_ids: Tensor, states: Sequence[ModelState], device: torch.device
) -> tuple[Tensor, Tensor]:
    """(ids [B, 1], positions [B, 1]) for a decode batch, checked against the states."""
    ids = to_device(input_ids.reshape(-1, 1), device)
    if ids.shape[0] != len(states) or not states:
        raise ValueError(f"forward_decode got {ids.shape[0]} ids for {len(states)} states")
    if any(s.batch_size != 1 for s in states):
        raise ValueError("forward_decode takes single-sequence states (batch_size 1)")
    positions = to_device(torch.tensor([[s.pos] for s in states]), device)
    return ids, positions


def per_layer_states(states: Sequence[ModelState]) -> list[list[LayerState]]:
    """Transpose per-sequence states into, for each layer, one state per row."""
    return [list(layer) for layer in zip(*(s.layers for s in states), strict=True)]


@dataclass
class LockstepGroup:
    """Sequences at one position as the rows of one lockstep batch inside a packed pass."""

    ids: Tensor  # [G, S] on the device, each row padded at the end to the longest
    batch: ModelState  # G rows, with rollback slack for the padding
    lengths: list[int]  # each row's real tokens


def pack_chunks(
    chunks: Sequence[Tensor],
    states: Sequence[ModelState],
    device: torch.device,
    groups: Sequence[LockstepGroup] = (),
) -> tuple[Tensor, Tensor, list[Packed], Tensor]:
    """(ids [1, N], positions [N], one :class:`Packed` per layer, last-token rows) for
    lockstep ``groups`` (row by row) followed by single-sequence spans."""
    if len(chunks) != len(states) or not (chunks or groups):
        raise ValueError(f"forward_packed got {len(chunks)} chunks for {len(states)} states")
    if any(s.batch_size != 1 for s in states):
        raise ValueError("forward_packed takes single-sequence states (batch_size 1)")
    lengths = [int(c.numel()) for c in chunks]
    if lengths and min(lengths) < 1:
        raise ValueError("every packed chunk needs at least one token")
    pieces = [g.ids.reshape(-1) for g in groups]
    if chunks:
        pieces.append(to_device(torch.cat([c.reshape(-1) for c in chunks]), device))
    positions, last, offset = [], [], 0
    for g in groups:
        height, width = g.ids.shape
        positions.append(torch.arange(g.batch.pos, g.batch.pos + width).repeat(height))
        last += [offset + j * width + n - 1 for j, n in enumerate(g.lengths)]
        offset += height * width
    for s, n in zip(states, lengths, strict=True):
        positions.append(torch.arange(s.pos, s.pos + n))
        offset += n
        last.append(offset - 1)
    sizes = [g.ids.numel() for g in groups] + lengths
    rows = [g.ids.shape[0] for g in groups] + [1] * len(chunks)
    members = [g.batch for g in groups] + list(states)
    packed = [Packed(list(layer), sizes, rows) for layer in per_layer_states(members)]
    ids = torch.cat(pieces)[None]
    return (
        ids,
        to_device(torch.cat(positions), device),
        packed,
        to_device(torch.tensor(last), device),
    )


def advance_packed(
    groups: Sequence[LockstepGroup], chunks: Sequence[Tensor], states: Sequence[ModelState]
) -> None:
    """Advance the states of a packed pass: group batches by their width, spans by their
    chunk."""
    for g in groups:
        g.batch.pos += g.ids.shape[1]
    for chunk, s in zip(chunks, states, strict=True):
        s.pos += chunk.numel()


#: Fewest fresh prompts worth a lockstep chunk of their own.
MIN_GROUP = 2
#: Most padding a lockstep group may add on an accelerator, as a fraction of its real tokens.
#: Each span of a packed pass costs its own attention ops per layer, so where the host bounds
#: the step a padded batch is far cheaper than the spans (H200, tiny V4.1: 8 prompts of 64-512
#: tokens, 131 ms as spans, 49 ms padded to the longest); where compute bounds it the padding
#: is wasted work, hence the cap, and none on the CPU (there the same 8 prompts take 0.94 s
#: as spans, 1.33 s padded).
MAX_PADDING = 0.5
#: Most bytes of compressed entries a lockstep group of sequences under way may copy into its
#: batch state (each row's entries so far; a fresh prompt has none). Long contexts run as
#: spans instead, whose attention reads the entries where they are.
MAX_GATHER_BYTES = 1 << 30


def lockstep_groups(
    chunks: Sequence[Tensor],
    states: Sequence[ModelState],
    max_padding: float = MAX_PADDING,
    continuing: bool = True,
    max_gather_bytes: int = MAX_GATHER_BYTES,
) -> list[list[int]]:
    """Indices of sequences at one position (fresh prompts, or with ``continuing`` also
    sequences under way: suffixes after a prefix-cache hit, the next pieces of chunked
    prompts) in groups of at least :data:`MIN_GROUP` of similar chunk length: each group runs
    as one lockstep chunk padded to its longest (its sequences see identical positions, so
    row i of a [G, S] batch state is sequence i's, once rolled back to its own length). A
    group's padding stays within ``max_padding`` times its real tokens (0: equal lengths
    only), and the entries its rows bring along within ``max_gather_bytes``."""
    ready = sorted(
        (s.pos, int(chunk.numel()), i)
        for i, (chunk, s) in enumerate(zip(chunks, states, strict=True))
        if not s.slack and s.batch_size == 1 and chunk.numel() and (continuing or not s.pos)
    )
    per_token = entry_bytes_per_token(states[0]) if ready else 0.0
    groups: list[list[int]] = []
    group: list[int] = []
    real, pos = 0, -1
    for p, n, i in ready:  # ascending: the newest member is the group's longest
        padded = (len(group) + 1) * n > (1 + max_padding) * (real + n)
        copied = (len(group) + 1) * p * per_token > max_gather_bytes
        if group and (p != pos or padded or copied):
            groups.append(group)
            group, real = [], 0
        group.append(i)
        real, pos = real + n, p
    groups.append(group)
    return [sorted(g) for g in groups if len(g) >= MIN_GROUP]


def take_rows(x: Tensor, rows: Tensor | None) -> Tensor:
    """``x`` [B, S, ...] at sequence positions ``rows``: [R] the same for every row, [B, 1]
    one per row (a padded lockstep batch), or None for all."""
    if rows is None:
        return x
    if rows.dim() == 1:
        return x[:, rows]
    return x[torch.arange(x.shape[0], device=x.device)[:, None], rows]


def all_slotted(states: Sequence[ModelState]) -> bool:
    """Whether every state lives in the same shared slot tensors, entries included, with no
    rollback history (the shared-rows decode path keeps none)."""
    ring = states[0].layers[0].swa.pool
    if ring is None or any(s.layers[0].swa.pool is not ring or s.slack for s in states):
        return False
    return all(
        comp.pool is not None and comp.pool.pages is not None
        for layer in states[0].layers
        for comp in (layer.compressor, layer.indexer)
        if comp is not None
    )


def slot_ids(states: Sequence[ModelState], device: torch.device) -> Tensor:
    """[B] the slot of each slotted state."""
    return to_device(torch.tensor([s.layers[0].swa.slot for s in states]), device)


def step_rows(layers: Sequence[LayerState], slots: Tensor, num_tokens: int) -> list[SlotRows]:
    """:func:`slot_rows` of every layer of one decode step, sharing one step memo."""
    memo = StepMemo()
    return [slot_rows(layer, slots, num_tokens, memo) for layer in layers]


def slot_rows(
    layer: LayerState,
    slots: Tensor,
    num_tokens: int,
    step_memo: StepMemo,
) -> SlotRows:
    """One layer's shared tensors for decode rows ``slots``; entries are read up to what a
    sequence of ``num_tokens`` tokens has."""

    def rows(comp: CompressorState | None) -> CompressorRows | None:
        if comp is None:
            return None
        assert comp.pool is not None
        return CompressorRows(comp.pool, slots, comp.ratio, num_tokens // comp.ratio, step_memo)

    assert layer.swa.pool is not None
    return SlotRows(layer.swa.pool, slots, rows(layer.compressor), rows(layer.indexer), step_memo)


def slot_tensors(layers: Sequence[LayerState]) -> list[Tensor]:
    """Every shared tensor a slotted decode step reads or writes."""
    out: list[Tensor] = []
    for layer in layers:
        assert layer.swa.pool is not None
        out.append(layer.swa.pool)
        for comp in (layer.compressor, layer.indexer):
            if comp is not None and comp.pool is not None:
                out += [t for t in vars(comp.pool).values() if isinstance(t, Tensor)]
                if comp.pool.page_table is not None:
                    out.append(comp.pool.page_table.table)
    return out


def advance_slotted(state: ModelState) -> None:
    """The host-side counters of a state whose shared rows a decode step advanced to
    ``state.pos`` tokens."""
    pos = state.pos
    for layer in state.layers:
        layer.swa.length = pos
        for comp in (layer.compressor, layer.indexer):
            if comp is not None:
                comp.fill, comp.count = pos % comp.ratio, pos // comp.ratio
