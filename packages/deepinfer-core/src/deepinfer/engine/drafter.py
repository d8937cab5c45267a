"""What the engine asks of a speculator (``deepinfer.speculators``), and building one."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from torch import Tensor

from deepinfer import plugins
from deepinfer.engine.spec_config import SpeculativeConfig
from deepinfer.models.causal_lm import DeepseekCausalLM
from deepinfer.models.state import ModelState


class Drafter(Protocol):
    """What the engine asks of a speculator (``deepinfer.speculators``).

    ``draft_batch`` gets, per request, the rows of every position verified since its last
    round (``lengths`` of them, in request order) and the token after each: the target's final
    streams [N, hc, d], or, where the drafter names ``feature_layers``, those layers' outputs
    concatenated per position [N, F] (DSpark). It returns [requests, k] drafts; a row may end
    in -1s, drafts not worth verifying (DSpark's confidence threshold). Adaptive scheduling
    also needs their confidences (:class:`.verify_schedule.ConfidentDrafter`). A drafter
    with ``use_graphs(graphs)`` is handed the engine's CUDA graphs to replay its rounds from,
    and one with ``capture_graphs(state)`` captures them at engine start over a throwaway
    state of the engine's slots (graphs that read the slot tensors: MTP's).
    """

    k: int

    def draft_batch(
        self,
        states: Sequence[ModelState],
        streams: Tensor,
        next_ids: Tensor,
        lengths: Sequence[int],
    ) -> Tensor: ...


def load_drafter(config: SpeculativeConfig, model: DeepseekCausalLM) -> Drafter:
    """The registered speculator for ``config.method``, built for ``model``."""
    factory: Any = plugins.speculators.load(config.method)
    options = {"path": config.model, "confidence_threshold": config.confidence_threshold}
    return factory(model, config.num_speculative_tokens, **{k: v for k, v in options.items() if v})
