"""Engine options, with vLLM's names where vLLM has one, and the vLLM options accepted for
compatibility (:func:`engine_config` reads ``LLM(**options)``)."""

from __future__ import annotations

import difflib
from dataclasses import dataclass, fields

from deepinfer.checks import is_int, is_number
from deepinfer.errors import InvalidRequestError


@dataclass
class EngineConfig:
    #: Requests decoded together (vLLM's default); the state budget still bounds admission.
    max_num_seqs: int = 256
    #: Tokens one step may run (vLLM's name; its server default). Fewer, larger prefill
    #: passes: on the H200 the tiny model's nano-vllm bench (128 prompts of 64-512 tokens)
    #: runs 1.5x faster at 8192 than at 2048; a step's decode rows wait for its prefill.
    max_num_batched_tokens: int = 8192
    #: Longest sequence (prompt + output); None = the model's max_position_embeddings.
    max_model_len: int | None = None
    #: Bytes the per-request model state (SWA rings, compressed entries, ...) may use.
    state_memory_bytes: int = 4 << 30
    enable_prefix_caching: bool = True
    prefix_cache_bytes: int = 1 << 30
    #: Seed for requests that give none; per request, not a global generator.
    seed: int = 0
    #: Bitwise-identical logits for a request whatever its batch and chunking. The reference
    #: runner gets there by running every token through the model on its own (fixed shapes,
    #: fixed reduction order), which makes prefill as slow as decode.
    batch_invariant: bool = False
    #: Run decode steps eagerly, without CUDA graphs (vLLM's name). Otherwise, on a GPU whose
    #: backend allows it, the whole decode step over the state slots is captured once per batch
    #: bucket and entry bucket and replayed with one launch.
    enforce_eager: bool = False
    #: Queue step n+1 before reading step n's tokens (vLLM's name), so the host's scheduling
    #: and output work overlaps the device's. None: on where it can overlap anything (a CUDA
    #: device) and batch_invariant is off; a CPU runs every op in the calling thread anyway.
    async_scheduling: bool | None = None
    #: The ``deepinfer.grammars`` plugin that enforces structured outputs: ``"auto"`` (xgrammar,
    #: falling back to llguidance for schemas xgrammar would enforce inexactly), ``"xgrammar"``
    #: or ``"llguidance"`` (vLLM's backend names).
    structured_outputs_backend: str = "auto"
    #: vLLM's ``{"method": "mtp", "num_speculative_tokens": k}`` (None: no speculation).
    speculative_config: dict[str, object] | None = None

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "speculative_config":
                continue  # checked where it is parsed (engine/speculative.py)
            if f.name in _OPTIONAL_BOOLS:
                ok, expected = value is None or isinstance(value, bool), "None or a boolean"
            elif isinstance(f.default, bool):
                ok, expected = isinstance(value, bool), "a boolean"
            elif isinstance(f.default, str):
                ok, expected = isinstance(value, str), "a string"
            else:  # the int options, max_model_len also None
                ok = (value is None and f.name == "max_model_len") or is_int(value)
                expected = "an integer"
            if not ok:
                raise InvalidRequestError(
                    f.name, f"must be {expected}, got {type(value).__name__} {value!r:.80}"
                )
        for name in ("max_num_seqs", "max_num_batched_tokens", "state_memory_bytes"):
            if getattr(self, name) < 1:
                raise InvalidRequestError(
                    name, f"must be a positive integer, got {getattr(self, name)}"
                )
        if self.prefix_cache_bytes < 0:
            raise InvalidRequestError("prefix_cache_bytes", "must be >= 0")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise InvalidRequestError("max_model_len", "must be at least 2")


#: Options whose None means "decide from the device".
_OPTIONAL_BOOLS = frozenset({"async_scheduling"})


#: vLLM options accepted so vLLM code runs unchanged: what each means here.
VLLM_OPTIONS = {
    "tensor_parallel_size": "1 only: several GPUs serve one model by data + expert parallelism",
    "gpu_memory_utilization": "the share of the GPU's memory for weights and state (GPU only)",
    "trust_remote_code": "accepted and ignored: DeepInfer never runs code from a checkpoint",
}
#: Headroom left on the GPU, beyond the weights, for activations and captured graphs when
#: ``gpu_memory_utilization`` sizes the state budget.
ACTIVATION_HEADROOM_BYTES = 2 << 30


def engine_config(options: dict[str, object]) -> tuple[EngineConfig, float | None]:
    """The engine options of ``LLM(**options)`` and ``gpu_memory_utilization`` (applied once
    the weights are on the device). Unknown names are refused with the closest known ones."""
    known = {f.name for f in fields(EngineConfig)}
    for name in options:
        if name not in known and name not in VLLM_OPTIONS:
            close = difflib.get_close_matches(name, [*known, *VLLM_OPTIONS], n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise InvalidRequestError(name, f"unknown option{hint}")
    tp = options.pop("tensor_parallel_size", 1)
    if not is_int(tp) or tp < 1:
        raise InvalidRequestError("tensor_parallel_size", f"must be a positive integer, got {tp!r}")
    if tp != 1:
        raise InvalidRequestError(
            "tensor_parallel_size",
            "tensor parallelism is not implemented; DeepInfer serves large models with "
            "attention data parallelism and expert parallelism",
        )
    if not isinstance(options.pop("trust_remote_code", False), bool):
        raise InvalidRequestError("trust_remote_code", "must be a boolean")
    util = options.pop("gpu_memory_utilization", None)
    if util is not None and (not is_number(util) or not 0 < util <= 1):
        raise InvalidRequestError("gpu_memory_utilization", f"must be in (0, 1], got {util!r}")
    if util is not None and "state_memory_bytes" in options:
        raise InvalidRequestError(
            "gpu_memory_utilization", "give it or state_memory_bytes, not both"
        )
    return EngineConfig(**options), util  # type: ignore[arg-type]


def state_budget(device: str, utilization: float) -> int:
    """State bytes that keep weights + state within ``utilization`` of the GPU's memory."""
    import torch

    index = torch.device(device).index or 0
    total = torch.cuda.get_device_properties(index).total_memory
    in_use = torch.cuda.memory_reserved(index)
    budget = int(utilization * total) - in_use - ACTIVATION_HEADROOM_BYTES
    if budget <= 0:
        raise InvalidRequestError(
            "gpu_memory_utilization",
            f"{utilization} of {total} bytes leaves no room for state beyond the weights "
            f"({in_use} bytes) and activations",
        )
    return budget
