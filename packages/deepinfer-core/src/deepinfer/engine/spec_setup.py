"""The engine's speculative runner, built from ``EngineConfig.speculative_config``: the
registered drafter, its CUDA graphs, and the adaptive schedule that profiles it."""

from __future__ import annotations

from deepinfer.engine.config import EngineConfig
from deepinfer.engine.drafter import load_drafter
from deepinfer.engine.spec_config import SpeculativeConfig
from deepinfer.engine.speculative import SpeculativeRunner
from deepinfer.engine.verify_schedule import adaptive_verifier
from deepinfer.errors import InvalidRequestError
from deepinfer.models.causal_lm import DeepseekCausalLM
from deepinfer.models.graphs import DecodeGraphs


def speculation(
    config: EngineConfig, model: DeepseekCausalLM, *, graphs: DecodeGraphs | None = None
) -> SpeculativeRunner | None:
    """The engine's speculative runner for ``config.speculative_config`` (None: off);
    ``graphs``: the engine's, which replay its plain decode steps and verification steps
    (the adaptive schedule prices both so)."""
    spec = SpeculativeConfig.parse(config.speculative_config)
    if spec is None:
        return None
    if config.async_scheduling or config.batch_invariant:
        raise InvalidRequestError(
            "speculative_config", "cannot be combined with async_scheduling or batch_invariant yet"
        )
    try:
        drafter = load_drafter(spec, model)
    except (NotImplementedError, ValueError) as exc:  # none for this model or version (yet)
        raise InvalidRequestError("speculative_config", str(exc)) from exc
    if graphs is not None and not spec.enforce_eager and hasattr(drafter, "use_graphs"):
        drafter.use_graphs(graphs)  # its rounds replay graphs too (profiled so below)
    verifier = None
    if spec.scheduling == "adaptive":
        verifier = adaptive_verifier(
            drafter,
            model,
            config.max_num_seqs,
            spec.verify_cost,
            spec.draft_cost,
            spec.plain_cost,
            cuda_graphs=graphs is not None,
        )
    return SpeculativeRunner(model, drafter, verifier, graphs)
