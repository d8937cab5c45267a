"""Engine options, with vLLM's names where vLLM has one."""

from __future__ import annotations

from dataclasses import dataclass

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
    #: backend allows it, the decode step (whole for V4 in state slots, else each layer's FFN
    #: half) is captured once per batch bucket and replayed with one launch.
    enforce_eager: bool = False
    #: Queue step n+1 before reading step n's tokens (vLLM's name), so the host's scheduling
    #: and output work overlaps the device's. None: on where it can overlap anything (a CUDA
    #: device) and batch_invariant is off; a CPU runs every op in the calling thread anyway.
    async_scheduling: bool | None = None

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens", "state_memory_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise InvalidRequestError(name, f"must be a positive integer, got {value!r}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise InvalidRequestError("max_model_len", "must be at least 2")
