"""One token budget per step: ``{request: n_tokens}`` mixing decode and chunked prefill.

Running requests go first (a decode needs one token, an unfinished prefill continues with the
next chunk), then waiting requests are admitted in priority/arrival order while the step's token
budget, ``max_num_seqs`` and the state pool allow. When the pool cannot pay for a running
request's growth, the lowest-priority running request is preempted: its state is dropped and it
goes back to the front of the queue to be recomputed, never losing its generated tokens.

With asynchronous scheduling the previous step's tokens may still be on the device: they count
as tokens to feed (the runner takes them from the device), a request whose in-flight tokens
already reach its length limit is not scheduled again, and a request waits to be (re)admitted
until the host has read them, since a prefill needs its tokens on the host.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass, field
from operator import attrgetter

from deepinfer.cache.pools import StatePool
from deepinfer.cache.prefix import Block, PrefixCache
from deepinfer.engine.request import Request, RequestStatus
from deepinfer.models.state import ModelState


@dataclass
class SchedulerOutput:
    scheduled: dict[Request, int] = field(default_factory=dict)
    preempted: list[Request] = field(default_factory=list)
    #: Requests whose state cannot grow even with the whole pool to themselves.
    out_of_memory: list[Request] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(self.scheduled.values())


class Scheduler:
    def __init__(
        self,
        pool: StatePool,
        new_states: Callable[[int], list[ModelState]],
        *,
        release_state: Callable[[ModelState], None] | None = None,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        prefix_cache: PrefixCache | None = None,
    ) -> None:
        self.pool = pool
        #: ``new_states(n)``: fresh states for the requests a step admits, made together
        #: (cheaper than one by one, see :meth:`.StateSlots.new_states`).
        self.new_states = new_states
        self.release_state = release_state
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.prefix_cache = prefix_cache
        self.waiting: list[Request] = []  # sorted by Request.sort_key
        self.running: list[Request] = []  # in admission order
        #: Requests that wait for their group's first sample to share its prefill.
        self.awaiting_fork: set[Request] = set()
        #: Requests of a failed step: each runs alone until it draws a token again, so the
        #: one that caused the failure fails alone and is found.
        self.suspects: set[Request] = set()
        #: Tokens a running request may feed beyond its own (speculative drafts): reserved in
        #: the pool with its next tokens.
        self.lookahead = 0

    # -- queue management ---------------------------------------------------------------------

    def add(self, req: Request) -> None:
        """Queue ``req`` in scheduling order (after requests of equal key: FCFS)."""
        bisect.insort(self.waiting, req, key=attrgetter("sort_key"))

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def finish(self, req: Request) -> None:
        if req in self.running:
            self.running.remove(req)
        if req in self.waiting:
            self.waiting.remove(req)
        self.awaiting_fork.discard(req)
        self.suspects.discard(req)
        self._drop_state(req)
        req.status = RequestStatus.FINISHED

    def preempt(self, req: Request) -> None:
        """Drop a running request's state; it waits to be recomputed from its tokens."""
        self.running.remove(req)
        self._drop_state(req)
        req.num_computed_tokens = 0
        req.cache_block = req.pending_block = None
        if req.prompt_logprobs is not None:
            req.prompt_logprobs = []  # recomputed from the start with the prompt
        req.status = RequestStatus.WAITING
        req.metrics.num_preemptions += 1
        self.add(req)

    def _drop_state(self, req: Request) -> None:
        self.pool.free(req.request_id)
        if req.state is not None and self.release_state is not None:
            self.release_state(req.state)
        req.state = None

    def try_fork(self, parent: Request, child: Request) -> bool:
        """Give ``child`` a copy of ``parent``'s just-finished prompt state, if it fits."""
        self.awaiting_fork.discard(child)
        if len(self.running) >= self.max_num_seqs or not self.pool.try_reserve(
            child.request_id, parent.num_computed_tokens
        ):
            return False
        self.waiting.remove(child)
        self.running.append(child)
        child.status = RequestStatus.RUNNING
        child.num_computed_tokens = parent.num_computed_tokens
        return True

    # -- the step -----------------------------------------------------------------------------

    def update_from_output(self, num_computed: dict[Request, int]) -> None:
        """Apply a step's progress (the runner's :class:`ModelRunnerOutput`): the tokens now in
        each scheduled request's state. The scheduler is the only writer of this count."""
        for req, n in num_computed.items():
            req.num_computed_tokens = n

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        # While a failed step's requests are suspects, one of them runs alone each step.
        alone = min(self.suspects, key=lambda r: r.sort_key) if self.suspects else None
        for req in list(self.running):
            if budget == 0:
                break
            if alone is not None and req is not alone:
                continue
            if req.status is not RequestStatus.RUNNING:  # preempted to make room for another
                continue
            if req.num_inflight and req.num_tokens >= req.max_total_tokens:
                continue  # finishes by length once the host reads its last token
            n = min(req.num_tokens - req.num_computed_tokens, budget)
            ahead = min(req.num_computed_tokens + n + self.lookahead, req.max_total_tokens)
            while not self.pool.try_reserve(req.request_id, ahead):
                if self.running == [req]:
                    out.out_of_memory.append(req)
                    break
                victim = max(self.running, key=lambda r: r.sort_key)
                self.preempt(victim)
                out.preempted.append(victim)
                if victim in out.scheduled:  # already given tokens this step: take them back
                    budget += out.scheduled.pop(victim)
                if victim is req:
                    break
            else:
                out.scheduled[req] = n
                budget -= n

        if alone is not None and alone.status is RequestStatus.WAITING:
            self._make_room(alone, min(alone.num_tokens, budget), out)
        elif out.preempted:  # the pool is full: admitting now would only thrash
            return out
        fresh: list[Request] = []  # admitted without a cached prefix: their states come together
        for req in list(self.waiting):
            if budget == 0 or len(self.running) >= self.max_num_seqs:
                break
            if alone is not None and req is not alone:
                continue
            if req in self.awaiting_fork or req.num_inflight:
                continue
            block = self._cached_prefix(req)
            cached = block.end if block is not None else 0
            n = min(req.num_tokens - cached, budget)
            if not self.pool.try_reserve(req.request_id, cached + n):
                if not self.running and not out.scheduled:
                    out.out_of_memory.append(req)
                break
            if block is not None and self.prefix_cache is not None:
                req.state = self.prefix_cache.restore(block, lambda: self.new_states(1)[0])
            else:
                fresh.append(req)
            if self.prefix_cache is not None and req.metrics.first_scheduled_time is None:
                # Counted once per request, at its first admission (not after preemptions).
                req.metrics.num_cached_tokens = min(cached, req.num_prompt_tokens)
                self.prefix_cache.stats.queries += req.num_prompt_tokens
                self.prefix_cache.stats.hits += req.metrics.num_cached_tokens
            req.num_computed_tokens = cached
            req.cache_block = block
            req.status = RequestStatus.RUNNING
            self.waiting.remove(req)
            self.running.append(req)
            out.scheduled[req] = n
            budget -= n
        for req, state in zip(fresh, self.new_states(len(fresh)), strict=True):
            req.state = state
        return out

    def _make_room(self, req: Request, num_tokens: int, out: SchedulerOutput) -> None:
        """Preempt running requests, lowest priority first, until ``req`` can be admitted
        with ``num_tokens`` tokens (a suspect that must run alone waits for no one)."""
        while self.running and (
            len(self.running) >= self.max_num_seqs
            or not self.pool.try_reserve(req.request_id, num_tokens)
        ):
            victim = max(self.running, key=lambda r: r.sort_key)
            self.preempt(victim)
            out.preempted.append(victim)

    def _cached_prefix(self, req: Request) -> Block | None:
        # Prompt logprobs need the logits of every prompt position, so they bypass the cache.
        if self.prefix_cache is None or req.params.prompt_logprobs is not None:
            return None
        return self.prefix_cache.match(req.all_token_ids)
