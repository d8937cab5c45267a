"""The front end of a data-parallel run, on rank 0: :class:`LLMEngine`'s interface over D ranks.

It owns the request queue: requests are validated here (by rank 0's engine, whose checks every
rank shares), routed by the :class:`~.balancer.Balancer` and sent to their rank with the next
step's commands. Each :meth:`DataParallelEngine.step` is one global step: a scatter of
commands, one step (one forward) on every rank, rank 0's included, and a gather of outputs and
metrics. Unseeded requests get their seed here, drawn in submission order from the engine seed
as a single engine draws them, so a request samples the same tokens at any world size.

A fault (a worker that exited, a collective that failed or timed out, a forward that failed)
ends the run: every rank is stopped, the unfinished requests fail with a
:class:`DataParallelError` that names the cause, and so does every later call.
"""

from __future__ import annotations

import copy
import random
import threading
import time
import weakref
from collections.abc import Container
from typing import NoReturn

from tokenizers import Tokenizer

from deepinfer.dp.balancer import Balancer
from deepinfer.dp.group import DataParallelError, RankGroup, gather_replies, send_commands, serve
from deepinfer.dp.keepalive import KeepAlive
from deepinfer.dp.lockstep import RankStepper
from deepinfer.dp.protocol import RankMetrics, RequestSpec, StepCommand, StepReply
from deepinfer.engine.config import EngineConfig
from deepinfer.engine.engine import LLMEngine
from deepinfer.engine.request import Request
from deepinfer.engine.runner import ModelRunner
from deepinfer.errors import InvalidRequestError
from deepinfer.models.causal_lm import DeepseekCausalLM
from deepinfer.outputs import RequestOutput

#: Seconds a failed step waits for a worker's exit to name the rank that died.
DEATH_WAIT_S = 1.0


class DataParallelEngine:
    """Rank 0's engine (``local``) and the other ranks behind one :class:`LLMEngine` face."""

    def __init__(self, local: LLMEngine, group: RankGroup) -> None:
        self.local = local
        self.group = group
        self.world_size = size = group.options.data_parallel_size
        self.stepper = RankStepper(local, 0)
        self.balancer = Balancer(size, group.options.dp_affinity_margin_tokens)
        #: Unfinished requests -> their rank.
        self.groups: dict[str, int] = {}
        self._new: list[list[RequestSpec]] = [[] for _ in range(size)]
        self._abort: list[list[str]] = [[] for _ in range(size)]
        self._reset = False
        self._seeds = random.Random(local.config.seed)
        self.rank_metrics = [RankMetrics(rank=r) for r in range(size)]
        self.num_steps = 0
        self.failure: DataParallelError | None = None
        #: Held by every exchange with the ranks; :class:`KeepAlive` pings between steps.
        self.lock = threading.RLock()
        self.last_exchange = time.monotonic()
        cuda = local.model.device.type == "cuda"
        self.keepalive = KeepAlive(
            self, group.options.dp_timeout_s, group.local_rank if cuda else None
        )
        self._finalizer = weakref.finalize(self, _end_run, self.keepalive, group)

    # -- what callers read of an engine: rank 0's ----------------------------------------------

    @property
    def model(self) -> DeepseekCausalLM:
        return self.local.model

    @property
    def tokenizer(self) -> Tokenizer:
        return self.local.tokenizer

    @property
    def config(self) -> EngineConfig:
        return self.local.config

    @property
    def runner(self) -> ModelRunner:
        return self.local.runner

    @property
    def eos_token_ids(self) -> set[int]:
        return self.local.eos_token_ids

    @property
    def max_model_len(self) -> int:
        return self.local.max_model_len

    @property
    def async_scheduling(self) -> bool:
        """Whether the ranks' engines read each step's tokens during the next (rank 0's, as
        every rank's engine has the same configuration)."""
        return self.local.async_scheduling

    # -- requests -----------------------------------------------------------------------------

    def make_request(
        self,
        prompt_token_ids: list[int],
        params: object = None,
        request_id: str | None = None,
        *,
        prompt: str | None = None,
        priority: int = 0,
    ) -> list[Request]:
        """Validate a request as rank 0's engine does (every rank's checks are the same)."""
        self._check_alive()
        if request_id is not None and request_id in self.groups:
            raise InvalidRequestError("request_id", f"{request_id!r} is already in use")
        return self.local.make_request(
            prompt_token_ids,
            params,  # type: ignore[arg-type]
            request_id,
            prompt=prompt,
            priority=priority,
        )

    def add_request(self, prompt_token_ids: list[int], *args: object, **kwargs: object) -> str:
        members = self.make_request(prompt_token_ids, *args, **kwargs)  # type: ignore[arg-type]
        self.submit([members])
        return members[0].group_id

    def submit(self, requests: list[list[Request]]) -> None:
        """Route and queue validated requests, all or none; each goes out with the next step."""
        self._check_alive()
        ids = [members[0].group_id for members in requests]
        for group_id in ids:
            if group_id in self.groups or ids.count(group_id) > 1:
                raise InvalidRequestError("request_id", f"{group_id!r} is already in use")
        for members in requests:
            first = members[0]
            params = copy.copy(first.params)
            if params.seed is None:
                params.seed = self._seeds.getrandbits(63)
            spec = RequestSpec(
                first.group_id, first.prompt_token_ids, params, first.prompt, first.priority
            )
            totals = [m.max_total_tokens for m in members]
            rank = self.balancer.route(first.group_id, first.prompt_token_ids, totals)
            self._new[rank].append(spec)
            self.groups[first.group_id] = rank

    def abort_request(self, request_id: str) -> RequestOutput | None:
        """Stop a request; its rank drops it with the next step. Returns None: the output of
        an aborted request is not waited for."""
        rank = self.groups.pop(request_id, None)
        if rank is None:
            return None
        self.balancer.finish(request_id)
        queued = [s for s in self._new[rank] if s.request_id != request_id]
        if len(queued) < len(self._new[rank]):
            self._new[rank] = queued  # never sent: nothing to abort there
        else:
            self._abort[rank].append(request_id)
        return None

    def reset_prefix_cache(self) -> bool:
        """Drop every rank's cached blocks (with the next step) and the balancer's shadow."""
        if self.local.prefix_cache is None:
            return False
        self._reset = True
        self.balancer.index.clear()
        return True

    def has_unfinished_requests(self) -> bool:
        return bool(self.groups)

    def metrics(self) -> list[RankMetrics]:
        """Each rank's metrics after the latest step, with its outstanding tokens and expert
        load. The ranks report in a round of their own (no step, no forward), so the device
        counters are read only here, not every step; after a fault, the last step's."""
        if self.failure is None:
            report = StepCommand(report_only=True)
            self.rank_metrics = [r.metrics for r in self._exchange([report] * self.world_size)]
        for m, load in zip(self.rank_metrics, self.balancer.loads, strict=True):
            m.outstanding_tokens = load
        return self.rank_metrics

    # -- the step -----------------------------------------------------------------------------

    def step(self, final_only: bool = False, watch: Container[str] = ()) -> list[RequestOutput]:
        """One global step on every rank; the outputs of the requests that changed (as
        :meth:`LLMEngine.step`: with ``final_only``, only finished or watched ones)."""
        self._check_alive()
        watched = [
            frozenset(g for g, r in self.groups.items() if r == rank and g in watch)
            for rank in range(self.world_size)
        ]
        commands = [
            StepCommand(self._new[r], self._abort[r], watched[r], final_only, self._reset)
            for r in range(self.world_size)
        ]
        self._new = [[] for _ in range(self.world_size)]
        self._abort = [[] for _ in range(self.world_size)]
        self._reset = False
        replies = self._exchange(commands)
        self.num_steps += 1
        return self._collect(replies)

    def ping(self) -> None:
        """A round in which no rank steps (the keep-alive's: an idle run's ranks would
        otherwise wait for a command past the timeout)."""
        self._exchange([StepCommand(keepalive=True)] * self.world_size)

    def is_over(self) -> bool:
        return self.failure is not None

    def _exchange(self, commands: list[StepCommand]) -> list[StepReply]:
        """Scatter the commands, run rank 0's, gather every rank's reply; a failure ends the
        run (naming the rank that died, when one did)."""
        with self.lock:
            self._check_alive()  # a keep-alive may have ended the run meanwhile
            dead = self.group.dead_worker()
            if dead is not None:
                self._fault(dead, None)
            try:
                return gather_replies(self.stepper.run(send_commands(commands)))
            except BaseException as exc:
                reason = self.group.dead_worker(wait_s=DEATH_WAIT_S) or (
                    "a data-parallel step failed (a rank failed, or hung past dp_timeout_s="
                    f"{self.group.options.dp_timeout_s}s): {exc!r}"
                )
                self._fault(reason, exc)
            finally:
                self.last_exchange = time.monotonic()

    def _collect(self, replies: list[StepReply]) -> list[RequestOutput]:
        outs = []
        for rank, reply in enumerate(replies):
            self.rank_metrics[rank] = reply.metrics
            for out in reply.outputs:
                if self.groups.get(out.request_id) != rank:
                    continue  # aborted meanwhile
                if out.finished:
                    del self.groups[out.request_id]
                    self.balancer.finish(out.request_id)
                outs.append(out)
        return outs

    def _fault(self, reason: str, cause: BaseException | None) -> NoReturn:
        """End the run: stop every rank, fail the unfinished requests, raise."""
        lost = sorted(self.groups)
        shown = ", ".join(lost[:8]) + (", ..." if len(lost) > 8 else "")
        self.failure = DataParallelError(
            f"{reason}; every rank was stopped and {len(lost)} unfinished requests failed"
            + (f" ({shown})" if lost else "")
        )
        self.groups.clear()
        self._finalizer.detach()
        self.keepalive.stop()
        self.group.close(graceful=False)
        if cause is not None and not isinstance(cause, Exception):
            raise cause  # Ctrl-C: the run is over, the caller decides the rest
        raise self.failure from cause

    def _check_alive(self) -> None:
        if self.failure is not None:
            raise self.failure

    def shutdown(self) -> None:
        """Stop every rank and leave the process group (also done when garbage-collected or
        at exit)."""
        with self.lock:  # not while a keep-alive exchanges
            self._finalizer()
        if self.failure is None:
            self.failure = DataParallelError("the data-parallel run was shut down")


def _end_run(keepalive: KeepAlive, group: RankGroup) -> None:
    """Stop the keep-alive, then the ranks (the front end's finalizer)."""
    keepalive.stop()
    group.close(True)


def front_end(engine: LLMEngine, group: RankGroup) -> DataParallelEngine:
    """Rank 0: the front end over ``engine`` and the other ranks. Any other rank serves
    steps until rank 0 ends the run, then its process exits (never returns)."""
    if group.rank == 0:
        return DataParallelEngine(engine, group)
    serve(engine, group)
    raise SystemExit(0)
