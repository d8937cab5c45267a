"""Speculative decoding in the engine: draft, verify as k-token rows, keep what passes.

Each step feeds every decoding request its last token and the drafts proposed for it after the
previous step, as one span that keeps every logit: the verification pass, replayed from a CUDA
graph on a GPU (with prefill chunks beside them, the ragged pass).
Verification (:mod:`.spec_sampling`) draws the token at every position of the row as the sampler
would, with the noise of that position, keeps the drafts that equal those draws and emits the
first draw that differs (or the one after the last draft): one to k + 1 tokens per request, each
the token the engine draws there without speculation. So outputs are the target's own (greedy
and seeded alike), in any batch and however many drafts a step verifies. The state is rolled
back to the accepted tokens, and the speculator drafts the next round from the target's streams
at the verified positions; its drafts are read when the next step needs them
(:mod:`.draft_round`).

Every position of a row is processed as the sampler would process a draw there had the drafts
before it been emitted (:mod:`.spec_sampling`): penalties, logit bias, bad words, allowed
tokens, ``min_tokens`` and the grammar of structured outputs (drafts stop at the first one the
grammar rejects; the matcher advances by the tokens the engine takes in), so every option of
``SamplingParams`` applies losslessly. A step in which no row verifies a draft and no prefill
chunk runs is a plain decode step: the decode pass, one logit per row (the drafter's feature
layers still captured, so its contexts go on), as the confidence schedule wants whenever drafts
do not pay (:mod:`.verify_schedule`). Logprobs are the raw model's, as without speculation;
``n`` > 1 samples are forked after the prompt and speculate each on its own. Scope: synchronous
scheduling. A prefill chunk whose request asks for prompt logprobs runs in the engine's plain
step (every logit of the chunk kept), its step's requests drafting again after it.
"""

from __future__ import annotations

from collections.abc import Callable
from time import perf_counter
from typing import cast

import torch
from torch import Tensor

from deepinfer.engine.draft_round import LaunchedRound, charge
from deepinfer.engine.drafter import Drafter
from deepinfer.engine.request import Request
from deepinfer.engine.runner import SampledToken
from deepinfer.engine.scheduler import Scheduler, SchedulerOutput
from deepinfer.engine.spec_sampling import PositionTargets, eos_ids, step_targets
from deepinfer.engine.spec_step import PendingPositions, Recorder, SpecStep, count_round
from deepinfer.engine.step_load import is_decoding
from deepinfer.engine.verify_schedule import AdaptiveVerifier
from deepinfer.models.batch import ForwardBatch, ForwardOutput, SequenceSpan
from deepinfer.models.causal_lm import DeepseekCausalLM
from deepinfer.models.graphs import DecodeGraphs
from deepinfer.models.state import ModelState
from deepinfer.transfer import to_device


class SpeculativeRunner:
    """Runs speculative steps (see the module) for the engine's runner."""

    def __init__(
        self,
        model: DeepseekCausalLM,
        drafter: Drafter,
        verifier: AdaptiveVerifier | None = None,
        graphs: DecodeGraphs | None = None,
    ) -> None:
        self.model = model
        #: The engine's CUDA graphs: verification steps replay theirs (None: eager), rows
        #: padded to the longest, k + 1 tokens.
        self.graphs = graphs
        if graphs is not None:
            graphs.verify_width = drafter.k + 1
        self.drafter = drafter
        #: Trims each step's drafts to a confidence schedule (None: verify what was drafted).
        self.verifier = verifier
        self.k = drafter.k
        #: Whether the drafter cuts its rounds at a confidence threshold (-1s on the device).
        self.cuts = getattr(drafter, "threshold", 0.0) > 0
        self.drafts: dict[Request, list[int]] = {}
        #: The latest drafting round, until the next step takes its drafts (:meth:`_take`).
        self.launched: LaunchedRound | None = None
        self.pending: dict[Request, PendingPositions] = {}
        #: Drafts proposed and kept, over the engine's life (acceptance statistics).
        self.num_drafts = 0
        self.num_accepted = 0
        #: Steps that ran as plain decode steps, here or as the engine's (:meth:`runs`).
        self.plain_steps = 0
        #: Drafting passes run (a round whose drafts a later trim drops still counts).
        self.draft_passes = 0
        #: Wall seconds spent drafting and in steps that verified drafts (each pass once).
        self.draft_seconds = 0.0
        self.verify_seconds = 0.0
        #: When the step in flight began, if its time teaches the verifier (decode-only).
        self._started: float | None = None

    def capture_graphs(
        self, new_state: Callable[[], ModelState], release: Callable[[ModelState], None]
    ) -> None:
        """Have a drafter whose graphs read the engine's slot tensors (MTP's chained passes)
        capture them, over a throwaway state of the slots, now that those exist."""
        capture = getattr(self.drafter, "capture_graphs", None)
        if capture is not None:
            state = new_state()
            capture(state)
            release(state)

    def step(
        self,
        out: SchedulerOutput,
        runner: Recorder,
        scheduler: Scheduler,
        append: Callable[[SampledToken], None],
        changed: dict[str, None],
    ) -> None:
        """One engine step: run ``out``, apply its progress, take in each request's tokens
        one by one (a stop among them ends the request there), forget ended requests."""
        result = self.execute(out, runner)
        if self._started is not None and self.verifier and self.verifier.overhead is not None:
            cost = self.verifier.predicted(len(out.scheduled), result.positions, result.drafted)
            is_round = not result.plain or result.drafted > 0
            self.verifier.overhead.launched(self._started, is_round, cost)
        scheduler.update_from_output(result.num_computed)
        for req, tokens in result.tokens.items():
            for token, logprob in tokens:
                if req.finished:
                    break
                append(SampledToken(req, token, logprob, None))
            changed[req.group_id] = None
        for req in [r for r in {**self.drafts, **self.pending} if r.finished or r.state is None]:
            self.forget(req)

    def runs(self, out: SchedulerOutput) -> bool:
        """Whether ``out`` needs a speculative step. Under adaptive scheduling, a step none
        of whose rows has drafts, whose requests drafting would not pay for
        (:meth:`.verify_schedule.AdaptiveVerifier.drafting_pays`, on the survivals expected of
        a round: the drafts do not exist yet), runs as the engine's plain step instead, prefill
        chunks included: nothing of speculation, not even the drafter's features, which no
        round would read. Its requests' drafter contexts then start again after it (their
        features of the plain step's positions were never taken). A step whose drafts the
        plan drops runs as a plain decode step here, features captured, since drafting the
        next round may pay. Decode-only steps are timed (:mod:`.step_overhead`). A step with
        a prompt-logprobs chunk is always the engine's plain step (fixed scheduling too)."""
        if not out.scheduled:
            return True
        decode_only, noisy = True, 0  # one pass over the rows: this runs before every step
        for req, n in out.scheduled.items():
            noisy += req.params.temperature > 0
            if not is_decoding(req, n):
                decode_only = False
                if req.prompt_logprobs is not None:
                    # prompt logprobs: every logit of the chunk, which the plain step keeps
                    return self._plain(list(out.scheduled))
        if self.verifier is None:
            return True
        self._take()
        rows, overhead = list(out.scheduled), self.verifier.overhead
        start = overhead.begin(decode_only) if overhead is not None else 0.0
        self._started = start if overhead is not None and decode_only else None
        drafted = self.drafts and any(self.drafts.get(r) for r in rows)
        if drafted or self.verifier.drafting_pays(rows, self.k, noisy):
            return True
        if overhead is not None and decode_only:
            overhead.launched(start, False, self.verifier.predicted(len(rows), len(rows), 0))
        return self._plain(rows)

    def _plain(self, rows: list[Request]) -> bool:
        """Hand the step of ``rows`` to the engine's plain path (False: not speculative)."""
        self._take()
        if self.drafts or self.pending:  # (a run of plain steps has neither)
            for req in rows:
                self.forget(req)
        self.plain_steps += 1
        return False

    def _pending(self, req: Request) -> PendingPositions:
        found = self.pending.get(req)
        if found is None or found.state is not req.state:
            found = self.pending[req] = PendingPositions(req.state)
        return found

    def forget(self, req: Request) -> None:
        """Drop a finished or preempted request's drafts and pending positions."""
        self.drafts.pop(req, None)
        self.pending.pop(req, None)

    @torch.no_grad()
    def execute(self, out: SchedulerOutput, runner: Recorder) -> SpecStep:
        """Run ``out``'s spans; ``runner`` records the prefix cache's blocks that prefill
        chunks complete (verification rows record none: their states hold drafts). Every
        draw of the step (each verification row's positions, each prefill chunk that ends its
        sequence) comes from one call of the sampler (:func:`.spec_sampling.step_targets`). A
        step of single-token rows only (no drafts left to verify, no prefill chunk) takes the
        decode pass, as a plain step does."""
        result = SpecStep()
        if not out.scheduled:  # nothing to run this step (a preemption only)
            return result
        ahead = self._ahead(out)
        if ahead is None:
            self._take()
        if self.verifier is not None:
            self.verifier.trim(out, self.drafts)
        reqs, ids, keep, marks, rows = [], [], [], [], []
        for req, n in out.scheduled.items():
            start = req.num_computed_tokens
            verifying = n == 1 and start >= req.num_prompt_tokens and start + 1 == req.num_tokens
            chunk = req.all_token_ids[start : start + n]
            self._mtp_from(req, start)
            if ahead is not None:  # placeholders: the pass reads the drafts on the device
                chunk = chunk + [0] * ahead[1][req]
            elif verifying:  # drafts spent here: a round that is not drafted must not find them
                chunk = chunk + self.drafts.pop(req, [])
            reqs.append(req)
            rows.append(verifying)
            ids.append(chunk)
            keep.append(len(chunk) if verifying else 1)
            marks.append(() if verifying else tuple(runner.boundaries(req, start + n)))
        chunks = [torch.tensor(c, dtype=torch.long) for c in ids]
        result.positions = sum(map(len, ids))
        states = [r.state for r in reqs]
        # Final streams only for a drafter that reads them: a plain step then leaves the
        # decode pass for the verification pass.
        streams = not getattr(self.drafter, "feature_layers", None)
        batch = ForwardBatch.build(chunks, states, keep, marks, return_streams=streams)  # type: ignore[arg-type]
        result.plain = len(batch.decode_rows) == len(batch.spans)
        self.plain_steps += result.plain
        begin = perf_counter()
        output, per_token = self._forward(batch, None if ahead is None else ahead[0])
        if ahead is not None:  # the drafts verified, read with the pass (its wait)
            self._take(timed=False)
            ids = [c[:1] + self.drafts.pop(r) for r, c in zip(reqs, ids, strict=True)]
        logits = output.split(batch)
        ends = [s.start + s.num_tokens for s in batch.spans]
        draws = [i for i, req in enumerate(reqs) if rows[i] or ends[i] == req.num_tokens]
        cfg = self.model.cfg
        found = step_targets(
            [reqs[i] for i in draws],
            [ids[i][1:] if rows[i] else [] for i in draws],
            [logits[i] if rows[i] else logits[i][-1:] for i in draws],
            eos_ids(cfg.eos_token_id),
            cfg.image_token_id,
            self.model.ops,
        )
        targets = dict(zip(draws, found, strict=True))  # (read on the host: the pass is done)
        if not result.plain:  # a step that verified drafts (its prefill chunks beside them)
            seconds = perf_counter() - begin
            self.verify_seconds += seconds
            for req in (r for r, row in zip(reqs, rows, strict=True) if row):
                req.metrics.spec_verify_time += seconds
        for i, req in enumerate(reqs):
            span, streams = batch.spans[i], per_token[batch.offsets[i] :][: len(ids[i])]
            if rows[i]:
                self._verify(req, span, len(ids[i]) - 1, targets[i], streams, result)
                continue
            for view in output.states_at[i]:
                runner.record_block(req, view)
            self._prefill(req, span, targets.get(i), streams, result)
            runner.maybe_record(req)
        if result.rollbacks:  # every rejecting row's state, together (before it drafts again)
            self.model.rollback_many(result.rollbacks)
        self._draft(result)
        return result

    def _mtp_from(self, req: Request, start: int) -> None:
        """Start ``req``'s MTP layer at ``start`` where it is behind with no positions pending
        (a prefix-cache hit, or positions the engine's plain steps ran): without the window
        before."""
        state = req.state
        assert state is not None
        if self._pending(req).next_ids == [] and state.mtp_pos < start:
            state.mtp_pos = start
            for layer in state.mtp:
                layer.swa.length = start

    def _forward(self, batch: ForwardBatch, drafts: Tensor | None) -> tuple[ForwardOutput, Tensor]:
        """Run ``batch`` (verification rows through the engine's graphs, their ``drafts``
        from the device where given); with every position's final streams, or, where the
        drafter reads intermediate layers (DSpark), those layers' outputs."""
        layers = getattr(self.drafter, "feature_layers", None)
        if layers:
            output = self.model(batch, self.graphs, capture=layers, drafts=drafts)
            assert output.features is not None
            return output, output.features
        output = self.model(batch, self.graphs, drafts=drafts)
        assert output.streams is not None
        return output, output.streams

    def _prefill(
        self,
        req: Request,
        span: SequenceSpan,
        target: PositionTargets | None,
        streams: Tensor,
        result: SpecStep,
    ) -> None:
        """A chunk of the prompt (or of tokens recomputed after a preemption): its positions
        wait for the drafter; the last one of the sequence draws the next token (``target``)."""
        start, n = span.start, span.num_tokens
        pending = self._pending(req)
        result.num_computed[req] = start + n
        pending.streams.append(streams)
        after = req.all_token_ids[start + 1 : start + n + 1]
        if target is None:
            pending.next_ids += after
            return
        emitted = result.tokens[req] = target.emit(req, 1)
        pending.next_ids += [*after, emitted[0][0]]

    def _verify(  # noqa: PLR0917
        self,
        req: Request,
        span: SequenceSpan,
        offered: int,
        target: PositionTargets,
        streams: Tensor,
        result: SpecStep,
    ) -> None:
        """A verification row of ``offered`` drafts: keep the drafts that pass, take the
        token after them; the state is rolled back to what was kept with the step's other
        rows (:meth:`execute`). Drafts after a stop token or one the grammar rejects are not
        verified (:mod:`.spec_sampling`): they count as rejected."""
        start = span.start
        n_kept = target.kept()
        emitted = target.tokens[: n_kept + 1]
        result.tokens[req] = target.emit(req, n_kept + 1)
        self.num_drafts += offered
        self.num_accepted += n_kept
        if self.verifier is not None:
            self.verifier.verified(req, emitted, start + 1)
        count_round(req, offered, n_kept, result.plain)
        assert req.state is not None
        if n_kept < offered:  # else the state holds just what was kept (no token list to build)
            ids = req.all_token_ids + emitted[:-1]
            result.rollbacks.append((req.state, start + n_kept + 1, ids))
        result.num_computed[req] = start + n_kept + 1
        pending = self._pending(req)
        pending.streams.append(streams[: n_kept + 1])
        pending.next_ids += emitted

    def _draft(self, result: SpecStep) -> None:
        """Draft the next round for every request that emitted tokens this step, in one
        batched pass of the speculator; at most what the request may still generate. Under
        adaptive scheduling, none when drafting the round would not pay (see :meth:`runs`)."""
        reqs = [r for r in result.tokens if r.state is not None]
        if not reqs:
            return
        if self.verifier is not None and not self.verifier.drafting_pays(reqs, self.k):
            return  # (priced on a decoding row each) positions stay pending, for a round that pays
        pieces = [self.pending.pop(r) for r in reqs]
        parts = [s for p in pieces for s in p.streams]
        streams = parts[0] if len(parts) == 1 else torch.cat(parts)  # (one: no copy to make)
        next_ids = to_device(torch.tensor([t for p in pieces for t in p.next_ids]), streams.device)
        lengths = [len(p.next_ids) for p in pieces]
        states = cast(list[ModelState], [r.state for r in reqs])
        result.drafted = len(reqs)
        self.draft_passes += 1
        begin = perf_counter()
        if self.verifier is not None:  # the drafts and, for the schedule, their confidences
            round_ = self.verifier.draft(self.drafter, reqs, states, streams, next_ids, lengths)  # type: ignore[arg-type]
        else:
            round_ = self.drafter.draft_batch(states, streams, next_ids, lengths), None
        rooms = [r.max_total_tokens - r.num_tokens - len(result.tokens[r]) for r in reqs]
        self.launched = LaunchedRound(reqs, rooms, *round_, cut=self.cuts)
        self.draft_seconds += charge(reqs, perf_counter() - begin)

    def _ahead(self, out: SchedulerOutput) -> tuple[Tensor, dict[Request, int]] | None:
        """The latest round's drafts for ``out`` to verify on the device, read after its pass
        is launched (:meth:`.LaunchedRound.ahead`): where every row of ``out`` verifies
        drafts of that round, with no plan to trim them first. Else None."""
        if self.launched is None or self.verifier is not None:
            return None
        if not all(is_decoding(r, n) for r, n in out.scheduled.items()):
            return None
        return self.launched.ahead(list(out.scheduled))

    def _take(self, timed: bool = True) -> None:
        """Take in the latest round's drafts (and confidences): a step needs them now (read
        with a verification pass, ``timed`` False, the wait is the pass's)."""
        if self.launched is None:
            return
        begin = perf_counter() if timed else 0.0
        drafts, confidence = self.launched.read()
        self.launched = None
        self.drafts.update(drafts)
        if self.verifier is not None:
            self.verifier.took(confidence)
        if timed:
            self.draft_seconds += charge(list(drafts), perf_counter() - begin)
