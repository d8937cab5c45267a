"""What V4 and V4.1 share: parameters around the layers, state, the step, training, weights.

Module attribute names are the official checkpoint names (``embed.weight``,
``layers.3.attn.compressor.ape``, ``mtp.0.e_proj.weight``, ...), so loading is a strict
name-for-name copy of what the checkpoint reader yields. A version (``deepseek_v4.py``,
``deepseek_v41.py``) adds its layer stack and how it runs (:meth:`run_layers`), the rest is here.

Usage::

    model = DeepseekV4ForCausalLM(cfg, dtype=torch.bfloat16, device="cuda")
    logits = model.forward_logits(ids)              # whole sequence, no state kept
    state = model.new_state(batch_size=1)
    out = model(ForwardBatch.of(ids[:, :37], state))  # any chunking gives the same logits
    logits = model.step(ids[:, 37:38], state)         # the same, as [B, S, V]
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace

import torch
from torch import Tensor, nn

from deepinfer.backends.base import Backend
from deepinfer.backends.torch_ref import TorchBackend
from deepinfer.config import ModelConfig
from deepinfer.models.batch import ForwardBatch, ForwardOutput, SequenceSpan
from deepinfer.models.decode import run_decode, slot_decodable
from deepinfer.models.errors import CheckpointError
from deepinfer.models.graphs import DecodeGraphs
from deepinfer.models.images import embed_tokens
from deepinfer.models.layer_capture import captured_layers, features_of
from deepinfer.models.layers.mhc import add_hc_params
from deepinfer.models.layers.mtp import MTPBlock
from deepinfer.models.layers.norm import Embedding, Linear, RMSNorm
from deepinfer.models.layers.rope import Rotary
from deepinfer.models.layouts import span_memo
from deepinfer.models.ragged import run_ragged
from deepinfer.models.rollback import rollback_states
from deepinfer.models.state import ModelState, clone_or_none
from deepinfer.models.state_views import clear_marks, set_marks, states_at
from deepinfer.models.training import mtp_context, train_logits
from deepinfer.models.trunk import LayerInputs, history_after
from deepinfer.models.verify import run_verify, verifies, with_drafts
from deepinfer.models.weights import load_named
from deepinfer.transfer import to_device


class DeepseekCausalLM(nn.Module):
    """The shared model (see the module); subclasses build ``layers`` in :meth:`build_layers`
    and run them in :meth:`run_layers`."""

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
            self.layers = self.build_layers(cfg, dtype)
            self.norm = RMSNorm(d, cfg.rms_norm_eps)
            if self.uses_hc_head(cfg):
                add_hc_params(self, "hc_head", cfg, head=True)
            # Logits are computed in fp32 (held in bf16 where the checkpoint's values allow it:
            # :func:`~deepinfer.models.stored_formats.hold_bf16_projections`).
            self.head = Linear(d, cfg.vocab_size, torch.float32, computes_fp32=True)
            self.mtp = nn.ModuleList(
                MTPBlock(cfg, cfg.num_hidden_layers + i, dtype)
                for i in range(cfg.num_nextn_predict_layers)
            )
        self.rebuild_derived_buffers()

    def rebuild_derived_buffers(self) -> None:
        """(Re)compute the RoPE tables on the model's device: derived from the config, so a
        model planned on the meta device and then allocated gets them back here."""
        cfg, device = self.cfg, self.embed.weight.device
        rope_dim = cfg.qk_rope_head_dim
        self.rotary = {
            "main": Rotary.build(rope_dim, cfg.rope_theta, None, device),
            "compress": Rotary.build(rope_dim, cfg.compress_rope_theta, cfg.rope_scaling, device),
        }

    # -- per version ------------------------------------------------------------------------------

    def build_layers(self, cfg: ModelConfig, dtype: torch.dtype) -> nn.ModuleList:
        """The layer stack (and any parameters that go with it, under their official names)."""
        raise NotImplementedError

    def uses_hc_head(self, cfg: ModelConfig) -> bool:
        """Whether the final streams collapse through ``hc_head`` parameters."""
        return True

    def run_layers(self, inputs: LayerInputs) -> tuple[Tensor, Tensor]:
        """(fp32 logits at ``inputs.rows`` [B, R, V], final residual streams [B, S, hc, d])."""
        raise NotImplementedError

    #: V4.1 Engram's look-back: raw ids a token's n-grams reach back (0: no Engram).
    engram_history: int = 0

    def engram_ids(
        self, input_ids: Tensor, history: Tensor | None
    ) -> tuple[Tensor | None, Tensor | None]:
        """(V4.1 Engram's compressed ids with the look-back in front, the new look-back);
        (None, ``history``) for a model without Engram."""
        return None, history

    def engram_map(self, raw: Tensor) -> Tensor:
        """V4.1 Engram's compressed ids of raw token ids (any shape)."""
        raise NotImplementedError("this model has no Engram layers")

    def check_ready(self) -> None:
        """Raise if the model cannot run yet (V4.1: Engram's token map missing)."""

    # -- state ------------------------------------------------------------------------------------

    @property
    def device(self) -> torch.device:
        return self.embed.weight.device

    @property
    def has_mtp(self) -> bool:
        """Whether MTP layers were loaded; checkpoints saved by other tools often drop them."""
        return len(self.mtp) > 0

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
        self.rollback_many([(state, length, token_ids)])

    def rollback_many(self, rollbacks: Sequence[tuple[ModelState, int, Sequence[int]]]) -> None:
        """:meth:`rollback` for each (state, length, token_ids), all checked before any
        changes; slot-row buffers are rebuilt by a few ops for all (a verification's rows)."""
        rollback_states([(state, length) for state, length, _ in rollbacks])

    # -- the step ---------------------------------------------------------------------------------

    @torch.no_grad()
    def forward(
        self,
        batch: ForwardBatch,
        graphs: DecodeGraphs | None = None,
        capture: Sequence[int] = (),
        drafts: Tensor | None = None,
    ) -> ForwardOutput:
        """Run one step (see :mod:`.batch`): advance every span's state by its tokens and
        return the kept logits. Spans of states in the shared slot tensors run as one pass: a
        batch of single-token rows as the decode pass (captured whole by ``graphs`` on a GPU),
        verification rows (every logit kept, within the states' rollback slack) as the
        verification pass (:mod:`.verify`, captured the same way), any other mix as the ragged
        pass. Spans of states with their own tensors (tests, tools) run one after the other,
        each straight through the layers. ``capture``: layers whose outputs come back as
        ``features`` (a drafter's context): the verification pass returns them from its graph
        too; other passes then run eagerly, with hooks on those layers. ``drafts``: span i's
        later tokens, on the device (placeholders in ``batch``; :func:`.verify.with_drafts`)."""
        batch.check_fresh()
        self.check_ready()
        spans = batch.spans
        states = [s.state for s in spans]
        if verifies(self, batch, bool(capture)):
            self._check_text(batch.input_ids)
            chunks = [batch.span_ids(i)[0] for i in range(len(spans))]
            single = all(s.num_tokens == 1 for s in spans)
            width = None
            if graphs is not None:
                width = 1 if single else graphs.verify_width or max(s.slack for s in states) + 1
            out = run_verify(self, chunks, states, graphs, width, capture, drafts)
            return ForwardOutput(out.logits, [()] * len(spans), out.streams, out.features)
        if drafts is not None:
            batch = with_drafts(batch, drafts)
        if not capture:
            return self._forward(batch, graphs)
        with captured_layers(self, capture) as seen:
            output = self._forward(batch, None)  # hooks see every call of an eager pass
        return replace(output, features=features_of(seen, capture))

    def _forward(self, batch: ForwardBatch, graphs: DecodeGraphs | None) -> ForwardOutput:
        """:meth:`forward` but the verification pass."""
        spans = batch.spans
        states = [s.state for s in spans]
        # A lone decode row whose token is on the device (drawn by the previous step) takes the
        # decode pass too: it needs no look at its id (the sampler never draws an image token).
        if len(spans) == 1:
            on_device = batch.input_ids.device.type != "cpu"
            slotted = spans[0].is_decode and (graphs is not None or on_device)
            if not (slotted and slot_decodable(states)):
                return self._run_each(batch)
        if batch.image_embeds is None:
            self._check_text(batch.input_ids)
        if not slot_decodable(states):
            return self._run_each(batch)
        if len(batch.decode_rows) == len(spans) and not batch.return_streams:
            logits = run_decode(self, batch.input_ids, states, graphs)
            return ForwardOutput(logits, [()] * len(spans), None)
        chunks = [batch.span_ids(i)[0] for i in range(len(spans))]
        out = run_ragged(self, spans, chunks, batch.return_streams)
        return ForwardOutput(out.logits, out.views, out.streams)

    def _check_text(self, input_ids: Tensor) -> None:
        """Refuse image tokens without embeddings, where the ids are on the host (ids on an
        accelerator come from the sampler, which never draws one; checking them would wait
        for the step that drew them)."""
        image_id = self.cfg.image_token_id
        on_host = input_ids.device.type == "cpu"
        if image_id is not None and on_host and bool((input_ids == image_id).any()):
            raise ValueError(
                f"input_ids hold image tokens ({image_id}): images go in a batch of one span "
                "with image_embeds"
            )

    def _run_each(self, batch: ForwardBatch) -> ForwardOutput:
        """Each span straight through the layers, one after the other: no shared tensors to
        pack into, every row's kept positions of a [B, S] span from one pass."""
        logits, views, streams = [], [], []
        for i, span in enumerate(batch.spans):
            ids = batch.span_ids(i)
            state = span.state
            before = clone_or_none(state.token_history) if span.record_at else None
            set_marks(state, span.record_at)
            try:
                out, x = self.run_span(ids, span, batch.image_embeds)
                at = states_at(state, span.record_at)
            finally:
                clear_marks(state)
            for view in at:
                view.token_history = history_after(before, ids, view.pos - span.start, self.device)
            logits.append(out.flatten(0, 1))
            views.append(at)
            if batch.return_streams:
                streams.append(x.flatten(0, 1))
        return ForwardOutput(
            logits[0] if len(logits) == 1 else torch.cat(logits),
            views,
            (streams[0] if len(streams) == 1 else torch.cat(streams)) if streams else None,
        )

    def run_span(
        self, input_ids: Tensor, span: SequenceSpan, image_embeds: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """(logits [B, num_logits, V], streams [B, S, hc, d]) of one span, advancing its state;
        without ``no_grad``, so :meth:`forward_train` runs exactly this code with autograd."""
        state = span.state
        input_ids = to_device(input_ids, self.device)  # no wait for queued work (async steps)
        s = input_ids.shape[1]
        positions = torch.arange(state.pos, state.pos + s, device=self.device)
        embeds, image_mask = embed_tokens(
            self.embed, self.cfg.image_token_id, input_ids, image_embeds
        )
        engram, state.token_history = self.engram_ids(input_ids, state.token_history)
        rows = None
        if span.num_logits < s:
            rows = torch.arange(s - span.num_logits, s, device=self.device)
        inputs = LayerInputs(
            input_ids,
            positions,
            state.layers,
            engram_ids=engram,
            rows=rows,
            embeds=embeds,
            image_mask=image_mask,
        )
        with span_memo(state):
            logits, streams = self.run_layers(inputs)
        state.pos += s
        return logits, streams

    def logits(self, h: Tensor) -> Tensor:
        """fp32 logits of the collapsed final hidden states ``h`` [..., d]."""
        h = self.norm(self.ops, h.float())
        return self.head(self.ops, h)

    # -- conveniences over the step ---------------------------------------------------------------

    def step(
        self, input_ids: Tensor, state: ModelState, image_embeds: Tensor | None = None
    ) -> Tensor:
        """Advance ``state`` by ``input_ids`` [B, S]; fp32 logits [B, S, V] (tests, tools)."""
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be [batch, seq], got {tuple(input_ids.shape)}")
        out = self(ForwardBatch.of(input_ids, state, image_embeds=image_embeds))
        return out.logits.view(input_ids.shape[0], input_ids.shape[1], -1)

    @torch.no_grad()
    def forward_logits(
        self, input_ids: Tensor, chunk_size: int = 4096, image_embeds: Tensor | None = None
    ) -> Tensor:
        """Full-sequence logits [B, S, V] (fp32) with no state kept after the call.

        Long inputs run as a chunked prefill of ``chunk_size`` tokens, which gives the same
        logits while bounding the attention masks and activations to one chunk.
        """
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        state = self.new_state(input_ids.shape[0])
        chunks, used = [], 0
        image_id = self.cfg.image_token_id
        for i in range(0, input_ids.shape[1], chunk_size):
            ids = input_ids[:, i : i + chunk_size]
            part = None
            if image_embeds is not None:
                n = 0 if image_id is None else int((ids == image_id).sum())
                part, used = image_embeds[used : used + n], used + n
            chunks.append(self.step(ids, state, part))
        return torch.cat(chunks, dim=1)

    # -- training and drafting --------------------------------------------------------------------

    def forward_train(self, input_ids: Tensor) -> Tensor:
        """Full-sequence logits [B, S, V] (fp32) with autograd enabled, from a fresh state.

        Inference runs under ``no_grad``; training needs gradients through the very same maths,
        so this calls the undecorated :meth:`run_span`. Parameters are created with
        ``requires_grad=False``; a trainer switches on the ones it optimises. Selections (top-k
        routing, indexer picks) pass no gradient, as in any MoE/sparse model.
        """
        return self.forward_train_mtp(input_ids, with_mtp=False)[0]

    def forward_train_mtp(
        self, input_ids: Tensor, with_mtp: bool = True
    ) -> tuple[Tensor, list[Tensor]]:
        """:meth:`forward_train` plus the MTP layers' logits, for a joint training loss
        (:func:`~deepinfer.models.training.train_logits`)."""
        if with_mtp:
            self._require_mtp()
        return train_logits(self, input_ids, with_mtp)

    def _require_mtp(self) -> None:
        """Fail a drafting entry point with the reason, rather than an IndexError on ``mtp``."""
        if not self.has_mtp:
            raise CheckpointError(
                "this checkpoint has no MTP weights (num_nextn_predict_layers=0 or no mtp.* "
                "tensors): MTP drafting is unavailable, the main model works as usual"
            )

    @torch.no_grad()
    def mtp_forward(
        self, streams: Tensor, next_ids: Tensor, state: ModelState, depth: int = 0
    ) -> tuple[Tensor, Tensor]:
        """Draft logits for token t+2 from the main streams at t and token t+1.

        ``streams`` [B, S, hc_mult, d] come from a step with ``return_streams`` and
        ``next_ids`` [B, S] are the tokens one position later. The MTP layer runs at the
        positions of ``streams`` and keeps its own state (``state.mtp[depth]``, position
        ``state.mtp_pos``). Returns (logits [B, S, V] fp32, the MTP layer's output streams).
        """
        self._require_mtp()
        next_ids = next_ids.to(self.device)
        ctx = mtp_context(self, next_ids, state.mtp_pos)
        hidden, out_streams = self.mtp[depth].predict(
            streams, self.embed(next_ids), ctx, state.mtp[depth]
        )
        if depth == len(self.mtp) - 1:
            state.mtp_pos += next_ids.shape[1]
        return self.head(self.ops, hidden), out_streams

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
        what = (
            f"{type(self).__name__}, {self.cfg.num_hidden_layers} layers, "
            f"{self.cfg.num_nextn_predict_layers} MTP"
        )
        load_named(self.expected_tensors(), tensors, what)
