"""LLMEngine: add requests, step, collect outputs.

Each step schedules one token budget, runs the model, samples, and turns the new tokens into
text and stop decisions. Requests are validated when added, so a bad one fails alone with an
InvalidRequestError and never reaches a batch.

With asynchronous scheduling (on by default on a GPU) a step queues its forward and draws on the
device and, while they run, reads the previous step's tokens: detokenisation, stop checks and
the next schedule overlap the device's work instead of following it. Decode rows take their
input ids from the device, so nothing waits for a step before the next is queued. The cost is
one step of lag: a request that stops on a token (EOS, a stop string) has already been
scheduled once more, and that extra token is dropped. A step reads the previous tokens first
when the next one needs them on the host: a structured-output mask or a penalty depends on
them. A prefix-cache block that ends with a token in flight is snapshotted at the boundary and
keyed (recorded) when the token is read. With ``speculative_config`` a step verifies drafted
tokens and may emit several per request (:mod:`.speculative`).
"""

from __future__ import annotations

import itertools
import logging
import random
import time
from collections.abc import Container, Iterable

import torch
from tokenizers import Tokenizer

from deepinfer.cache.pools import StatePool
from deepinfer.cache.prefix import PrefixCache
from deepinfer.cache.slots import StateSlots
from deepinfer.engine.config import EngineConfig
from deepinfer.engine.detokenizer import Detokenizer
from deepinfer.engine.forks import fork_due, fork_for_speculation
from deepinfer.engine.graph_capture import capture_decode_graphs
from deepinfer.engine.output_processor import check_stop, request_output
from deepinfer.engine.processor import InputProcessor, fit_max_model_len
from deepinfer.engine.request import Request, RequestStatus
from deepinfer.engine.runner import ModelRunner, PendingSample, SampledToken
from deepinfer.engine.scheduler import Scheduler
from deepinfer.engine.spec_setup import speculation
from deepinfer.errors import InvalidRequestError
from deepinfer.models.causal_lm import DeepseekCausalLM
from deepinfer.models.graphs import DecodeGraphs
from deepinfer.outputs import RequestOutput
from deepinfer.sampling.rng import sample_seed
from deepinfer.sampling_params import SamplingParams
from deepinfer.structured import GrammarBackend

logger = logging.getLogger(__name__)

#: Steps a request may be part of a failed step before it is aborted (a request that fails
#: while it runs alone is aborted at once).
MAX_FAULTS = 3
#: Entry pages allocated at startup when decode steps are not captured (more come as needed).
INITIAL_PAGES = 64


class LLMEngine:
    def __init__(
        self,
        model: DeepseekCausalLM,
        tokenizer: Tokenizer,
        config: EngineConfig | None = None,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.config = config = config or EngineConfig()
        cfg = model.cfg
        eos = cfg.eos_token_id
        self.eos_token_ids = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
        self.pool = StatePool(cfg, model.dtype, config.state_memory_bytes)
        self.max_model_len = fit_max_model_len(
            self.pool, config.max_model_len, cfg.max_position_embeddings
        )
        self.prefix_cache = (
            PrefixCache(config.prefix_cache_bytes) if config.enable_prefix_caching else None
        )
        graphs = None
        if not config.enforce_eager and model.ops.supports_cuda_graphs(model.dtype):
            graphs = DecodeGraphs(config.max_num_seqs)
        #: Drafts and verifies tokens (``speculative_config``; None: one token a step).
        self.spec = speculation(config, model, graphs=graphs)
        slack = self.spec.k if self.spec is not None else 0
        # Captured decode steps bake in the slot and page tensors' addresses, which move when
        # they grow: with graphs, all are allocated up front (as vLLM sizes its KV cache).
        max_pages = self.pool.max_pages(config.max_num_seqs, self.max_model_len)
        self.slots = StateSlots(
            lambda: model.new_state(1, slack=slack),
            max_slots=config.max_num_seqs,
            max_len=self.max_model_len,
            initial_slots=config.max_num_seqs if graphs else 8,
            max_pages=max_pages,
            initial_pages=max_pages if graphs else INITIAL_PAGES,
        )
        if self.slots.page_table is not None and self.prefix_cache is not None:
            # Cached blocks hold entry pages: the pool takes them back when it runs short.
            self.slots.page_table.reclaim = self.prefix_cache.reclaim_page
        self.scheduler = Scheduler(
            self.pool,
            self.slots.new_states,
            release_state=self.slots.release,
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            prefix_cache=self.prefix_cache,
        )
        self.runner = ModelRunner(
            model,
            self.eos_token_ids,
            self.prefix_cache,
            batch_invariant=config.batch_invariant,
            graphs=graphs,
        )
        self.scheduler.lookahead = slack
        self.async_scheduling = (
            config.async_scheduling
            if config.async_scheduling is not None
            else model.device.type == "cuda" and not config.batch_invariant and not slack
        )
        if self.async_scheduling and config.batch_invariant:
            raise InvalidRequestError(
                "async_scheduling",
                "cannot be combined with batch_invariant (its token-by-token forwards read "
                "every token on the host)",
            )
        #: The last step's draws while the host has not read them (asynchronous scheduling).
        self._pending: PendingSample | None = None
        self.detokenizer = Detokenizer(tokenizer)
        self.processor = InputProcessor(
            cfg, tokenizer, config, self.max_model_len, self.eos_token_ids
        )
        self._seeds = random.Random(config.seed)
        self._ids = itertools.count()
        self.groups: dict[str, list[Request]] = {}
        self.num_steps = 0
        if graphs is not None:
            capture_decode_graphs(self.model, self.slots, graphs, self.max_model_len)
            if self.spec is not None:
                self.spec.capture_graphs(self.slots.new_state, self.slots.release)

    # -- requests -----------------------------------------------------------------------------

    def grammar_backend(self) -> GrammarBackend:
        """The grammar plugin that compiles this engine's constraints (built on first use)."""
        return self.processor.grammar_backend()

    def add_request(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams | None = None,
        request_id: str | None = None,
        *,
        prompt: str | None = None,
        priority: int = 0,
    ) -> str:
        """Validate and queue one request (its ``n`` samples); returns its id. A request that
        fails validation raises :class:`InvalidRequestError` and leaves nothing queued."""
        members = self.make_request(
            prompt_token_ids, params, request_id, prompt=prompt, priority=priority
        )
        self.submit([members])
        return members[0].group_id

    def make_request(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams | None = None,
        request_id: str | None = None,
        *,
        prompt: str | None = None,
        priority: int = 0,
    ) -> list[Request]:
        """Validate a request and build its samples without queueing anything, so a caller
        with several requests can check them all before any runs (:meth:`submit`)."""
        if request_id is not None and not isinstance(request_id, str):
            raise InvalidRequestError("request_id", "must be a string")
        group_id = request_id if request_id is not None else f"req-{next(self._ids)}"
        if group_id in self.groups:
            raise InvalidRequestError("request_id", f"{group_id!r} is already in use")
        return self.processor.make_request(
            group_id, prompt_token_ids, params, prompt=prompt, priority=priority
        )

    def submit(self, requests: list[list[Request]]) -> None:
        """Queue requests built by :meth:`make_request` (each a group of samples), all or
        none: ids are checked against each other before any is queued."""
        ids = [members[0].group_id for members in requests]
        for group_id in ids:
            if group_id in self.groups or ids.count(group_id) > 1:
                raise InvalidRequestError("request_id", f"{group_id!r} is already in use")
        for members in requests:
            params = members[0].params
            base_seed = params.seed if params.seed is not None else self._seeds.getrandbits(63)
            for req in members:
                req.seed = sample_seed(base_seed, req.index)
            members[0].fork_children = members[1:]
            self.scheduler.awaiting_fork.update(members[1:])
            for req in members:
                self.scheduler.add(req)
            self.groups[members[0].group_id] = members

    @torch.inference_mode()  # releasing a state writes slot and page tensors made in steps
    def abort_request(self, request_id: str) -> RequestOutput | None:
        """Stop every sample of ``request_id``; returns its final output (None if unknown)."""
        if request_id not in self.groups:
            return None
        for req in self.groups[request_id]:
            if not req.finished:
                req.finish_reason = "abort"
                self.scheduler.finish(req)
        return self.output(request_id)

    @torch.inference_mode()  # as abort_request
    def reset_prefix_cache(self) -> bool:
        """Drop every cached block (vLLM's name); False when the cache is off. Running
        requests keep their states, and blocks they would extend are simply not recorded."""
        if self.prefix_cache is None:
            return False
        self.prefix_cache.clear()
        return True

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished() or self._pending is not None

    # -- the step -----------------------------------------------------------------------------

    @torch.inference_mode()
    def step(self, final_only: bool = False, watch: Container[str] = ()) -> list[RequestOutput]:
        """Run one scheduling step; return the outputs of the groups that changed (only those
        that finished or are in ``watch``, with ``final_only``: what a non-streaming caller
        needs, without copying every running request's tokens into a new output each step).

        An exception inside the step is the last line of defence, as requests are validated
        when added: the step's requests are put back to be recomputed, and run alone until
        each has drawn a token again. One that fails alone is aborted with the error on its
        output; no other request loses work, and the engine keeps serving.

        Inference mode (cheaper per op than no_grad: no version counters or view tracking; about
        12% of a CPU decode step on the tiny model) covers every tensor the engine makes: states
        are created, forked, cached, restored and advanced only inside ``step`` (released
        outside it by ``abort_request`` and ``reset_prefix_cache``, in inference mode too).
        """
        changed: dict[str, None] = {}
        pending, self._pending = self._pending, None
        if pending is not None and self._needs_tokens(pending):
            self._read(pending, changed)
            pending = None
        out = self.scheduler.schedule()
        progress = out.scheduled or out.preempted or out.out_of_memory or pending or changed
        if not progress and self.groups:
            raise RuntimeError("scheduler made no progress with requests pending")
        now = time.monotonic()
        for req in out.scheduled:
            if req.metrics.first_scheduled_time is None:
                req.metrics.first_scheduled_time = now
        for req in out.out_of_memory:
            # Cannot happen while max_model_len fits the budget; never cut a request silently.
            self._fail(req, f"its state does not fit state_memory_bytes ({self.pool.budget_bytes})")
        try:
            if self.spec is not None and self.spec.runs(out):  # else a step not worth drafting
                self.spec.step(out, self.runner, self.scheduler, self._take_speculated, changed)
                launched = None
            else:
                ran = self.runner.execute(out)
                self.scheduler.update_from_output(ran.num_computed)
                due = ran.due + fork_due(ran.due, self.scheduler, self.slots)
                launched = self.runner.launch_sample(due)
        except BaseException as exc:
            if pending is not None:
                self._read(pending, changed)
            # The step's requests and the samples it may have forked from them (n > 1).
            groups = {r.group_id for r in out.scheduled}
            touched = [r for g in groups if g in self.groups for r in self.groups[g]]
            self._recover([r for r in touched if r.status is RequestStatus.RUNNING], exc, changed)
            if not isinstance(exc, Exception):
                raise  # Ctrl-C: every request is consistent again; the caller decides
            launched = None
        else:
            if self.async_scheduling:  # read the previous step's tokens while this one runs
                self._pending = launched
                launched = pending
        if launched is not None:
            self._read(launched, changed)
        for req in (*out.preempted, *out.out_of_memory):
            changed[req.group_id] = None
        self.num_steps += 1
        if final_only:
            changed = {
                g: None
                for g in changed
                if g in watch or (g in self.groups and all(r.finished for r in self.groups[g]))
            }
        return [self.output(g) for g in changed if g in self.groups]

    def _recover(self, reqs: list[Request], exc: BaseException, changed: dict[str, None]) -> None:
        """Undo a failed step for ``reqs``: each goes back to be recomputed from its tokens
        (a preemption), since the step may have advanced its state without drawing its token.

        For an exception, they become suspects that the scheduler runs one at a time; a
        request that failed alone, or in too many steps, is aborted with the error."""
        reqs = [r for r in dict.fromkeys(reqs) if not r.finished]
        if isinstance(exc, Exception):
            logger.error("a step failed (%s requests): %r", len(reqs), exc, exc_info=exc)
        alone = len({r.group_id for r in reqs}) == 1
        for req in reqs:
            changed[req.group_id] = None
            if isinstance(exc, Exception):
                req.num_faults += 1
                if alone or req.num_faults >= MAX_FAULTS:
                    self._fail(req, exc)
                    continue
                self.scheduler.suspects.add(req)
            if req.status is RequestStatus.RUNNING:
                self.scheduler.preempt(req)

    def _fail(self, req: Request, error: BaseException | str) -> None:
        """End ``req`` with finish reason "abort" and the error on its output."""
        req.finish_reason = "abort"
        req.error = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
        req.metrics.finished_time = time.monotonic()
        self.scheduler.finish(req)
        logger.warning("request %s aborted: %s", req.request_id, req.error)

    def _take_speculated(self, tok: SampledToken) -> None:
        """Take in a token of a speculative step: before a request's first, its group's
        other samples fork (:mod:`.forks`); its logprobs entry comes queued on it."""
        req = tok.request
        if not req.output_token_ids and req.fork_children:
            fork_for_speculation(req, self.scheduler, self.slots, self.model)
        tok.top = req.spec_logprobs.pop(0) if req.spec_logprobs else None
        self._append(tok)

    def _needs_tokens(self, pending: PendingSample) -> bool:
        """Whether the next step needs ``pending``'s tokens on the host before it is built."""
        return any(r.reads_host_tokens for r in pending.requests)

    def _read(self, pending: PendingSample, changed: dict[str, None]) -> None:
        """Take in a step's tokens; those of requests that ended meanwhile are dropped. A
        request whose token cannot be taken in (a bug or a plugin's error) fails alone."""
        try:
            tokens = pending.resolve()
        except Exception as exc:  # the draws are lost: recompute them
            for req in pending.requests:
                req.num_inflight -= 1
            self._recover(pending.requests, exc, changed)
            return
        for tok in tokens:
            req = tok.request
            req.num_inflight -= 1
            if not req.finished:
                try:
                    self._append(tok)
                except Exception as exc:
                    self._fail(req, exc)
                changed[req.group_id] = None

    def _append(self, tok: SampledToken) -> None:
        req = tok.request
        req.output_token_ids.append(tok.token_id)
        self.scheduler.suspects.discard(req)  # it drew a token again: back to batches
        if req.pending_block is not None:
            snap, req.pending_block = req.pending_block, None
            self.runner.record_block(req, snap)
        req.cumulative_logprob += tok.logprob
        if tok.top is not None:
            req.logprobs.append(tok.top)
        if req.metrics.first_token_time is None:
            req.metrics.first_token_time = time.monotonic()
        new_text = self.detokenizer.update(req)
        reason = check_stop(req, tok.token_id, new_text, self.eos_token_ids)
        if reason is not None:
            req.finish_reason = reason
            req.metrics.finished_time = time.monotonic()
            self.scheduler.finish(req)

    def output(self, group_id: str) -> RequestOutput:
        """The group's output; a finished group is forgotten once its output is made."""
        out = request_output(group_id, self.groups[group_id])
        if out.finished:
            del self.groups[group_id]
        return out

    def run(self, groups: Iterable[str] | None = None) -> dict[str, RequestOutput]:
        """Step until every request (or the given groups) finished; return final outputs."""
        wanted = set(groups) if groups is not None else set(self.groups)
        final: dict[str, RequestOutput] = {}
        while wanted - set(final) and self.has_unfinished_requests():
            for o in self.step(final_only=True):
                if o.finished and o.request_id in wanted:
                    final[o.request_id] = o
        return final
