"""DeepSeek-V4.1 text model on the Backend op table, with explicit state.

What differs from V4 (``deepseek_v4.py``) lives in ``layers/``: ratio-1/2 compressors owned by
KV-source layers and shared by their layer group (``shared_compressor``, ``shared_attention``),
index-source layers and the two-level candidate-block selection (``candidate_indexer``), the
lagged mHC pre-mix with no ``hc_head`` (``lagged_mhc``), and the Engram n-gram memory
(``engram``, ``engram_hash``). The three MTP layers are V4 MTP layers under ``mtp.{i}`` (V4.1
keeps the V4 scheme for them) and take what V4's take: the main model's final residual streams
(here before the lagged collapse, as there before ``hc_head``) and the next token
(:meth:`~.causal_lm.DeepseekCausalLM.mtp_forward`). The embedded model's MTP layers were trained
on exactly these streams (``models/training.py``); for the official V4.1 checkpoint the wiring
is inferred from the V4 scheme, and a wrong guess would cost acceptance, never correctness
(verification keeps the target's tokens).

Images: the vision tower is not part of this model. A caller that ran it passes the aligned image
embeddings as ``image_embeds`` [N, d], one row per ``image_token_id`` in ``input_ids`` (row-major
over batch then position); they replace the token embeddings there. Image positions also skip
Engram and route experts with the image bias.

Usage::

    model = DeepseekV41ForCausalLM(cfg, dtype=torch.bfloat16)
    model.set_engram_token_map(build_compressed_token_map(tokenizer))  # Engram needs it
    state = model.new_state(batch_size=1)
    logits = model.step(ids[:, :37], state)          # any chunking gives the same logits
    logits = model.step(ids[:, 37:38], state)
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch import Tensor, nn

from deepinfer.backends.base import Backend
from deepinfer.config import ModelConfig
from deepinfer.models.causal_lm import DeepseekCausalLM
from deepinfer.models.layers.candidate_indexer import SharedKV
from deepinfer.models.layers.mhc import HyperConnection
from deepinfer.models.layers.shared_block import SharedBlock, V41Context
from deepinfer.models.state import ModelState
from deepinfer.models.trunk import LayerInputs, take_rows
from deepinfer.transfer import to_device

#: Checkpoint tensors of the DSpark draft head that sit next to the MTP layers. Their names are
#: not published; they are kept verbatim in ``model.draft_tensors`` instead of failing the load.
DSPARK_PREFIXES = ("dspark.",)


def _is_draft_tensor(name: str) -> bool:
    if name.startswith(DSPARK_PREFIXES):
        return True
    parts = name.split(".")
    return parts[0] == "mtp" and len(parts) > 1 and not parts[1].isdigit()


class DeepseekV41ForCausalLM(DeepseekCausalLM):
    def __init__(
        self,
        cfg: ModelConfig,
        dtype: torch.dtype = torch.bfloat16,
        device: str | torch.device = "cpu",
        backend: Backend | None = None,
    ) -> None:
        if not cfg.is_v41:
            raise ValueError(f"model_type={cfg.model_type!r} is not a DeepSeek-V4.1 config")
        super().__init__(cfg, dtype, device, backend)
        self.engram_history = max(cfg.engram_max_ngram_size - 1, 0) if cfg.engram_layer_ids else 0
        self.engram_token_map: Tensor | None = None
        self.draft_tensors: dict[str, Tensor] = {}

    def build_layers(self, cfg: ModelConfig, dtype: torch.dtype) -> nn.ModuleList:
        return nn.ModuleList(SharedBlock(cfg, i, dtype) for i in range(cfg.num_hidden_layers))

    def uses_hc_head(self, cfg: ModelConfig) -> bool:
        """With the lagged pre-mix the last sublayer's pre-mix weights collapse the streams."""
        return not cfg.hc_pre_from_prev_sublayer

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

    def check_ready(self) -> None:
        if self.engram_history and self.engram_token_map is None:
            raise ValueError(
                "this model has Engram layers but no compressed token map: call "
                "model.set_engram_token_map(build_compressed_token_map(tokenizer)) first"
            )

    def engram_ids(
        self, input_ids: Tensor, history: Tensor | None
    ) -> tuple[Tensor | None, Tensor | None]:
        if not self.engram_history:
            return None, history
        assert history is not None and self.engram_token_map is not None
        raw = torch.cat((history, input_ids), dim=1)
        return self.engram_map(raw), raw[:, -self.engram_history :].clone()

    def engram_map(self, raw: Tensor) -> Tensor:
        assert self.engram_token_map is not None
        return self.engram_token_map[raw]

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

    def rollback_many(self, rollbacks: Sequence[tuple[ModelState, int, Sequence[int]]]) -> None:
        """Also rebuild each rolled-back state's Engram history from its token ids (one upload
        for all of them)."""
        rolled, recent = [], []
        h = self.engram_history
        for state, length, token_ids in rollbacks if h else ():
            if not 0 <= length < state.pos:
                continue
            if len(token_ids) < length:
                raise ValueError(
                    f"rolling back a V4.1 state needs the sequence's token ids (at least {length}) "
                    "to rebuild the Engram history"
                )
            ids = list(token_ids[max(0, length - h) : length])
            recent += [[self.cfg.engram_pad_token_id] * (h - len(ids)) + ids] * state.batch_size
            rolled.append(state)
        histories = to_device(torch.tensor(recent), self.device) if recent else None
        super().rollback_many(rollbacks)
        at = 0
        for state in rolled:
            assert histories is not None
            state.token_history = histories[at : at + state.batch_size]
            at += state.batch_size

    # -- the layers -------------------------------------------------------------------------------

    def run_layers(self, inputs: LayerInputs) -> tuple[Tensor, Tensor]:
        ids = inputs.input_ids
        e = self.embed(ids) if inputs.embeds is None else inputs.embeds
        states = inputs.layer_states
        shared = SharedKV()
        ctx = V41Context(
            ops=self.ops,
            positions=inputs.positions,
            input_ids=ids,
            rotary=self.rotary,
            shared=shared,
            image_mask=inputs.image_mask,
            engram_ids=inputs.engram_ids,
            engram_history=self.engram_history,
        )
        x = e[:, :, None, :].expand(-1, -1, self.cfg.hc_mult, -1).contiguous()
        pre: Tensor | None = None
        for layer, layer_state in zip(self.layers, states, strict=True):
            x, pre = layer(x, pre, ctx, layer_state)
        last = take_rows(x, inputs.rows)
        if pre is None:  # V4-style residual (hc_pre_from_prev_sublayer off)
            h = HyperConnection(self, "hc_head", self.cfg).head(self.ops, last)
        else:
            h = self.ops.mhc_collapse(last, take_rows(pre, inputs.rows))
        return self.logits(h), x

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
