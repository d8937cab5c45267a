"""What generation returns (vLLM names): a RequestOutput with a CompletionOutput per sample."""

from __future__ import annotations

from dataclasses import dataclass, field

#: token id -> logprob, for the sampled token and the top alternatives of one position.
Logprobs = dict[int, float]


@dataclass
class RequestMetrics:
    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens restored from the prefix cache
    num_preemptions: int = 0
    #: Speculative decoding: verification rows, drafts they checked, drafts kept, and how
    #: many rows kept a draft at each position (the acceptance per position).
    spec_rounds: int = 0
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0
    spec_accepted_per_position: list[int] = field(default_factory=list)
    #: Drafts proposed that the confidence schedule left unverified (``scheduling:
    #: "adaptive"``; 0 otherwise).
    spec_trimmed_tokens: int = 0
    #: Wall seconds of the drafting passes and of the verification steps this request was
    #: part of, each batched pass counted whole for every request in it (as vLLM's
    #: per-request model times are); the engine's own totals count each pass once
    #: (``SpeculativeRunner.draft_seconds``, ``verify_seconds``). A drafting pass is the host's
    #: time launching it and waiting for its drafts; drafts a verification pass takes on the
    #: device are read with that pass, their wait counted in its time.
    spec_draft_time: float = 0.0
    spec_verify_time: float = 0.0

    @property
    def spec_acceptance_length(self) -> float | None:
        """Mean tokens a verification row emitted (tau: kept drafts plus the one after);
        None without speculative rows."""
        if not self.spec_rounds:
            return None
        return (self.spec_accepted_tokens + self.spec_rounds) / self.spec_rounds

    @property
    def spec_verified_per_round(self) -> float | None:
        """Mean drafts a verification row checked (what the schedule let through); None
        without speculative rows."""
        if not self.spec_rounds:
            return None
        return self.spec_draft_tokens / self.spec_rounds


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None  # "stop" | "length" | "abort"
    stop_reason: int | str | None = None  # the stop token id or stop string that ended it
    #: Why the engine aborted this sample (finish reason "abort"), e.g. a failed step.
    error: str | None = None
    logprobs: list[Logprobs] | None = None
    cumulative_logprob: float | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = False
    prompt_logprobs: list[Logprobs | None] | None = None
    metrics: RequestMetrics | None = None
    #: Parsed chat fields (``LLM.chat``): reasoning and tool calls, when the recipe found any.
    reasoning_content: list[str | None] = field(default_factory=list)
    tool_calls: list[list[dict] | None] = field(default_factory=list)
