"""What the ways of running a step need from a model version: one pass over its layers.

V4 and V4.1 share everything around their layer stacks: the batch description, the state, the
ways spans run (a span straight through; a batch of single-token rows, :mod:`.decode`; spans of
any length over the shared slots, :mod:`.ragged`) and the output head. A version supplies
:meth:`StepModel.run_layers` (its layers and how their outputs reach the head) and
:meth:`StepModel.engram_ids` (V4.1's hashed look-back; none in V4), and the step code calls them
the same way for every kind of row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from deepinfer.backends.base import Backend
from deepinfer.config import ModelConfig
from deepinfer.models.layers.rope import Rotary
from deepinfer.models.layouts import LayerStates
from deepinfer.models.state import ModelState
from deepinfer.transfer import to_device


@dataclass
class LayerInputs:
    """One pass over the layers."""

    input_ids: Tensor  # [B, S] on the model's device
    positions: Tensor  # [S] for a chunk, [N] for packed spans, [B, 1] for decode rows
    layer_states: Sequence[LayerStates]  # one per layer, in the layout the rows need
    #: V4.1 Engram: compressed ids with the look-back in front, [B, history + S], or for
    #: packed spans each token's look-back window, [1, N, history + 1] (the token last);
    #: None without Engram.
    engram_ids: Tensor | None = None
    #: The positions whose logits to compute (:func:`take_rows`); None: all.
    rows: Tensor | None = None
    #: [B, S, d] token embeddings with any image embeddings in place (None: embed the ids).
    embeds: Tensor | None = None
    #: [B, S] True at image tokens (None: text only).
    image_mask: Tensor | None = None


class StepModel(Protocol):
    """The model as the step code sees it."""

    cfg: ModelConfig
    dtype: torch.dtype
    ops: Backend
    rotary: dict[str, Rotary]

    @property
    def device(self) -> torch.device: ...

    def new_state(self, batch_size: int = 1, slack: int = 0) -> ModelState: ...

    def run_layers(self, inputs: LayerInputs) -> tuple[Tensor, Tensor]:
        """(fp32 logits at ``inputs.rows`` [B, R, V], final residual streams [B, S, hc, d])."""
        ...

    #: raw ids V4.1 Engram's n-grams reach back (0: no Engram)
    engram_history: int

    def engram_ids(
        self, input_ids: Tensor, history: Tensor | None
    ) -> tuple[Tensor | None, Tensor | None]:
        """(compressed ids with the look-back in front, the look-back after ``input_ids``)."""
        ...

    def engram_map(self, raw: Tensor) -> Tensor:
        """Engram's compressed ids of raw token ids."""
        ...


def take_rows(x: Tensor, rows: Tensor | None) -> Tensor:
    """``x`` [B, S, ...] at sequence positions ``rows`` [R] (the same for every row), or
    all of it for None."""
    return x if rows is None else x[:, rows]


def history_after(
    before: Tensor | None, chunk: Tensor, n: int, device: torch.device
) -> Tensor | None:
    """The Engram look-back (the last ids, oldest first) after the first ``n`` ids of
    ``chunk``, from the look-back ``before`` it; None for a model without one."""
    if before is None:
        return None
    ids = to_device(chunk.reshape(1, -1)[:, :n], device)
    return torch.cat((before, ids), dim=1)[:, -before.shape[1] :]
