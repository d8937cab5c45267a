"""Per-request state as the engine tracks it between steps."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from tokenizers.decoders import DecodeStream

from deepinfer.cache.prefix import Block, Snapshot
from deepinfer.models.state import ModelState
from deepinfer.outputs import Logprobs, RequestMetrics
from deepinfer.sampling_params import SamplingParams
from deepinfer.structured import GrammarMatcher


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Request:
    """One sequence to generate. ``n > 1`` samples are separate Requests of one group.

    ``num_computed_tokens`` counts the tokens whose effect is in ``state``; the tokens from there
    to ``num_tokens`` still have to run through the model. After a preemption the state is
    dropped and everything (prompt and generated tokens) is recomputed, which the
    position-keyed sampler makes invisible in the output.

    With asynchronous scheduling a token may be sampled on the device before the host has read
    it (``num_inflight``): it counts in ``num_tokens`` (the next decode step feeds it from the
    device) but is not yet in ``output_token_ids`` or ``all_token_ids``.
    """

    request_id: str
    group_id: str
    index: int  # sample index within the group
    prompt_token_ids: list[int]
    params: SamplingParams
    seed: int
    metrics: RequestMetrics
    #: Prompt plus the most output tokens it may have (max_tokens, capped by max_model_len).
    max_total_tokens: int
    priority: int = 0
    prompt: str | None = None
    output_token_ids: list[int] = field(default_factory=list)
    status: RequestStatus = RequestStatus.WAITING
    num_computed_tokens: int = 0
    #: Tokens sampled on the device that the host has not read yet (0, or 1 between steps).
    num_inflight: int = 0
    state: ModelState | None = None
    finish_reason: str | None = None
    #: Why the engine aborted the request, when it did (finish reason "abort").
    error: str | None = None
    #: Failed steps this request was part of (the engine aborts it after a few).
    num_faults: int = 0
    stop_reason: int | str | None = None
    logprobs: list[Logprobs] = field(default_factory=list)
    #: The ``logprobs`` entries of the tokens a speculative step emitted, in order, until the
    #: engine takes each in with its token (the step hands the tokens over one by one).
    spec_logprobs: list[Logprobs] = field(default_factory=list)
    cumulative_logprob: float = 0.0
    prompt_logprobs: list[Logprobs | None] | None = None
    #: Group members that will copy this request's state when its prefill completes.
    fork_children: list[Request] = field(default_factory=list)
    #: ``params.bad_words`` as token sequences (each word as is and after a space).
    bad_words: list[list[int]] = field(default_factory=list)
    #: The output constraint's matcher (structured outputs), advanced with every token.
    grammar: GrammarMatcher | None = None
    #: The prefix-cache block at the last 128-token boundary this request passed.
    cache_block: Block | None = None
    #: The state at a boundary whose block ends with a token still in flight: recorded once
    #: the host reads that token (asynchronous scheduling).
    pending_block: Snapshot | None = None
    #: Text decoded so far, and the incremental decoder that extends it by each output token
    #: (:mod:`.detokenizer`; made at the first).
    text: str = ""
    decode_stream: DecodeStream | None = field(default=None, repr=False, compare=False)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids) + self.num_inflight

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids) + self.num_inflight

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    @property
    def reads_host_tokens(self) -> bool:
        """Whether the next step needs this request's last tokens on the host before it is
        scheduled: its mask or penalties depend on them (a multi-token bad word, on the last
        ones)."""
        return not self.finished and (
            self.grammar is not None
            or self.params.penalized
            or any(len(seq) > 1 for seq in self.bad_words)
        )

    @property
    def sort_key(self) -> tuple[int, float, str]:
        """Scheduling order: lower priority value first, then arrival (FCFS)."""
        return (self.priority, self.metrics.arrival_time, self.request_id)
