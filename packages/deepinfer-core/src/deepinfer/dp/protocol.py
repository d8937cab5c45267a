"""What the front end and the ranks exchange once per global step, as picklable dataclasses.

Rank 0 scatters one :class:`StepCommand` to every rank (``scatter_object_list``), every rank
runs one step and rank 0 gathers one :class:`StepReply` from each (``gather_object``): two
object collectives per step, whatever the number of requests.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from deepinfer.outputs import RequestOutput
from deepinfer.sampling_params import SamplingParams


@dataclass(frozen=True)
class RequestSpec:
    """A request as validated by the front end; the rank builds its samples again from it.
    ``params.seed`` is always set (the front end draws it for unseeded requests, in the order
    a single engine would), so a request samples the same tokens on any rank."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    prompt: str | None = None
    priority: int = 0


@dataclass
class StepCommand:
    """One rank's part of a global step."""

    new: list[RequestSpec] = field(default_factory=list)
    abort: list[str] = field(default_factory=list)
    #: Streamed requests: their output comes back after every step that changed it.
    watch: frozenset[str] = frozenset()
    #: Only finished (and watched) requests' outputs come back (what ``generate`` needs).
    final_only: bool = True
    reset_prefix_cache: bool = False
    #: Run no step, only report metrics with the expert load (every rank gets it, so no
    #: rank enters a forward's collectives alone).
    report_only: bool = False
    #: Run no step and report nothing: rank 0 keeps an idle run's waiting ranks alive.
    keepalive: bool = False
    #: Leave the loop and the process group: the run is over.
    stop: bool = False


@dataclass
class RankMetrics:
    """One rank's load and cache, as of the end of its latest step."""

    rank: int = 0
    waiting: int = 0
    running: int = 0
    prefix_cache_hit_rate: float = 0.0
    #: Steps in which the rank had no work and ran the dummy forward.
    dummy_steps: int = 0
    steps: int = 0
    #: Tokens its requests may still compute, as the front end's balancer counts them.
    outstanding_tokens: int = 0
    #: MoE layer name -> (token, slot) pairs this rank's tokens routed to each global expert,
    #: since the run started (dummy forwards not counted); filled by ``metrics()`` only.
    expert_load: dict[str, list[int]] = field(default_factory=dict)


@dataclass
class StepReply:
    """What a rank's step produced: its requests' outputs and its metrics."""

    outputs: list[RequestOutput] = field(default_factory=list)
    metrics: RankMetrics = field(default_factory=RankMetrics)
    #: Set when the rank's step failed in a way that breaks the lockstep (the run ends).
    error: str | None = None
