"""Speculative decoding in the engine: draft, verify as k-token rows, keep what passes.

Each step feeds every decoding request its last token and the drafts proposed for it after the
previous step, as one span that keeps every logit (prefill chunks ride in the same ragged pass).
Verification (:mod:`deepinfer.sampling.rejection`) keeps a prefix of the drafts and draws the
token after them, so a step emits one to k + 1 tokens per request, distributed as the target's
own (greedy requests get exactly the target's greedy tokens). The state is rolled back to the
accepted tokens, and the speculator drafts the next round from the target's streams at the
verified positions. Randomness is keyed by position (acceptance on its own stream, the emitted
token on the sampler's Gumbel noise), so a seeded request draws the same tokens in any batch;
they are not the tokens it draws without speculation (the residual draws differ).

Every position of a row is processed as the sampler would process a draw there had the drafts
before it been emitted (:mod:`.spec_sampling`): penalties, logit bias, bad words, allowed
tokens, ``min_tokens`` and the grammar of structured outputs (drafts stop at the first one the
grammar rejects; the matcher advances by the tokens the engine takes in), so every option of
``SamplingParams`` applies losslessly. Logprobs are the raw model's, as without speculation;
``n`` > 1 samples are forked after the prompt and speculate each on its own. Scope: synchronous
scheduling. Prompt logprobs are refused with speculation on, by name: a speculative step's
prefill chunks keep their last logit only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import Tensor

from deepinfer import plugins
from deepinfer.engine.config import EngineConfig
from deepinfer.engine.request import Request
from deepinfer.engine.runner import SampledToken
from deepinfer.engine.scheduler import Scheduler, SchedulerOutput
from deepinfer.engine.spec_sampling import PositionTargets, eos_ids, position_targets
from deepinfer.engine.verify_schedule import AdaptiveVerifier, adaptive_verifier, parse_scheduling
from deepinfer.errors import InvalidRequestError
from deepinfer.models.batch import ForwardBatch, SequenceSpan
from deepinfer.models.causal_lm import DeepseekCausalLM
from deepinfer.models.layer_capture import captured_layers, features_of
from deepinfer.models.state import ModelState
from deepinfer.sampling.rejection import draw, verify_sequence
from deepinfer.sampling_params import SamplingParams

#: Sampling options a speculative step does not apply yet: refused by name rather than ignored
#: (prompt logprobs need every logit of a prompt chunk, which its prefill keeps one of).
UNSUPPORTED = ("prompt_logprobs",)


@dataclass(frozen=True)
class SpeculativeConfig:
    """vLLM's ``speculative_config``: ``{"method": "mtp", "num_speculative_tokens": k}``;
    ``"scheduling": "adaptive"`` (vLLM: ``"enable_adaptive_verification": True``) plans each
    step's verified drafts from their confidences and the step's cost (:mod:`.verify_schedule`;
    ``"verify_cost": {tokens: seconds}`` gives the cost instead of profiling it)."""

    method: str
    num_speculative_tokens: int
    #: the drafter's directory (DSpark; None: the one shipped for the model, if any)
    model: str | None = None
    #: DSpark's static threshold (``dspark.md`` §7): verify drafts up to the first whose
    #: confidence is below it (0: every draft)
    confidence_threshold: float = 0.0
    scheduling: str = "fixed"
    verify_cost: tuple[tuple[int, float], ...] | None = None

    @classmethod
    def parse(cls, raw: object) -> SpeculativeConfig | None:
        if raw is None or isinstance(raw, SpeculativeConfig):
            return raw
        if not isinstance(raw, dict):
            raise InvalidRequestError("speculative_config", "must be a dict or None")
        known = {"method", "num_speculative_tokens", "model", "confidence_threshold"}
        known |= {"scheduling", "enable_adaptive_verification", "verify_cost"}
        unknown = set(raw) - known
        if unknown:
            raise InvalidRequestError("speculative_config", f"unknown keys {sorted(unknown)}")
        method, k = raw.get("method"), raw.get("num_speculative_tokens")
        if not isinstance(method, str):
            raise InvalidRequestError("speculative_config", "needs 'method' ('mtp' or 'dspark')")
        if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= 16:
            raise InvalidRequestError(
                "speculative_config", f"num_speculative_tokens must be 1..16, got {k!r}"
            )
        model = raw.get("model")
        if model is not None and (method != "dspark" or not isinstance(model, str)):
            raise InvalidRequestError(
                "speculative_config",
                "'model' names a DSpark drafter directory (MTP drafts with the checkpoint's "
                "own layers)",
            )
        threshold = raw.get("confidence_threshold", 0.0)
        if not isinstance(threshold, int | float) or isinstance(threshold, bool):
            raise InvalidRequestError("speculative_config", "confidence_threshold must be a number")
        if (threshold and method != "dspark") or not 0.0 <= threshold <= 1.0:
            raise InvalidRequestError(
                "speculative_config",
                f"confidence_threshold is DSpark's, in [0, 1]; got {threshold!r} for {method!r}",
            )
        return cls(method, k, model, float(threshold), *parse_scheduling(raw, float(threshold)))


def check_params(params: SamplingParams) -> None:
    """Refuse the sampling options a speculative step does not apply (see the module)."""
    defaults = SamplingParams()
    for name in UNSUPPORTED:
        if getattr(params, name, None) != getattr(defaults, name, None):
            raise InvalidRequestError(name, "not supported with speculative decoding yet")


class Drafter(Protocol):
    """What the engine asks of a speculator (``deepinfer.speculators``).

    ``draft_batch`` gets, per request, the rows of every position verified since its last
    round (``lengths`` of them, in request order) and the token after each: the target's final
    streams [N, hc, d], or, where the drafter names ``feature_layers``, those layers' outputs
    concatenated per position [N, F] (DSpark). It returns [requests, k] drafts; a row may end
    in -1s, drafts not worth verifying (DSpark's confidence threshold). Adaptive scheduling
    also needs their confidences (:class:`.verify_schedule.ConfidentDrafter`).
    """

    k: int

    def draft_batch(
        self,
        states: Sequence[ModelState],
        streams: Tensor,
        next_ids: Tensor,
        lengths: Sequence[int],
    ) -> Tensor: ...


def load_drafter(config: SpeculativeConfig, model: DeepseekCausalLM) -> Drafter:
    """The registered speculator for ``config.method``, built for ``model``."""
    factory: Any = plugins.speculators.load(config.method)
    options = {"path": config.model, "confidence_threshold": config.confidence_threshold}
    return factory(model, config.num_speculative_tokens, **{k: v for k, v in options.items() if v})


def speculation(config: EngineConfig, model: DeepseekCausalLM) -> SpeculativeRunner | None:
    """The engine's speculative runner for ``config.speculative_config`` (None: off)."""
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
    verifier = None
    if spec.scheduling == "adaptive":
        verifier = adaptive_verifier(drafter, model, config.max_num_seqs, spec.verify_cost)
    return SpeculativeRunner(model, drafter, verifier)


class Recorder(Protocol):
    """The runner's prefix-cache recording, as a speculative step uses it."""

    def boundaries(self, req: Request, end: int) -> list[int]: ...

    def record_block(self, req: Request, state: ModelState) -> None: ...

    def maybe_record(self, req: Request) -> None: ...


@dataclass
class SpecStep:
    """What a speculative step hands the engine."""

    num_computed: dict[Request, int] = field(default_factory=dict)
    #: Per request, the tokens it emits this step with their logprobs, in order.
    tokens: dict[Request, list[tuple[int, float]]] = field(default_factory=dict)


@dataclass
class _Pending:
    """A request's verified positions the drafter has not read yet, for the state they are
    in (a preempted request starts again with a new state)."""

    state: ModelState | None
    streams: list[Tensor] = field(default_factory=list)  # [m, hc, d] pieces
    next_ids: list[int] = field(default_factory=list)


class SpeculativeRunner:
    """Runs speculative steps (see the module) for the engine's runner."""

    def __init__(
        self, model: DeepseekCausalLM, drafter: Drafter, verifier: AdaptiveVerifier | None = None
    ) -> None:
        self.model = model
        self.drafter = drafter
        #: Trims each step's drafts to a confidence schedule (None: verify what was drafted).
        self.verifier = verifier
        self.k = drafter.k
        self.drafts: dict[Request, list[int]] = {}
        self.pending: dict[Request, _Pending] = {}
        #: Drafts proposed and kept, over the engine's life (acceptance statistics).
        self.num_drafts = 0
        self.num_accepted = 0

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
        scheduler.update_from_output(result.num_computed)
        for req, tokens in result.tokens.items():
            for token, logprob in tokens:
                if req.finished:
                    break
                append(SampledToken(req, token, logprob, None))
            changed[req.group_id] = None
        for req in [r for r in {**self.drafts, **self.pending} if r.finished or r.state is None]:
            self.forget(req)

    def _pending(self, req: Request) -> _Pending:
        found = self.pending.get(req)
        if found is None or found.state is not req.state:
            found = self.pending[req] = _Pending(req.state)
        return found

    def forget(self, req: Request) -> None:
        """Drop a finished or preempted request's drafts and pending positions."""
        self.drafts.pop(req, None)
        self.pending.pop(req, None)

    @torch.no_grad()
    def execute(self, out: SchedulerOutput, runner: Recorder) -> SpecStep:
        """Run ``out``'s spans; ``runner`` records the prefix cache's blocks that prefill
        chunks complete (verification rows record none: their states hold drafts)."""
        result = SpecStep()
        if not out.scheduled:  # nothing to run this step (a preemption only)
            return result
        if self.verifier is not None:
            self.verifier.trim(out, self.drafts)
        reqs, chunks, keep, marks, rows = [], [], [], [], []
        for req, n in out.scheduled.items():
            start = req.num_computed_tokens
            verifying = n == 1 and start >= req.num_prompt_tokens and start + 1 == req.num_tokens
            ids = req.all_token_ids[start : start + n]
            state = req.state
            assert state is not None
            if verifying:
                ids = ids + self.drafts.get(req, [])
            elif self._pending(req).next_ids == [] and state.mtp_pos < start:  # a cache hit
                state.mtp_pos = start  # its MTP layer starts here, without the window before
                for layer in state.mtp:
                    layer.swa.length = start
            reqs.append(req)
            rows.append(verifying)
            chunks.append(torch.tensor(ids, dtype=torch.long))
            keep.append(len(ids) if verifying else 1)
            marks.append(() if verifying else tuple(runner.boundaries(req, start + n)))
        states = [r.state for r in reqs]
        batch = ForwardBatch.build(chunks, states, keep, marks, return_streams=True)  # type: ignore[arg-type]
        layers = getattr(self.drafter, "feature_layers", None)
        if layers:  # the drafter reads intermediate layers' outputs (DSpark)
            with captured_layers(self.model, layers) as seen:
                output = self.model(batch)
            per_token = features_of(seen, layers)
        else:
            output = self.model(batch)
            assert output.streams is not None
            per_token = output.streams
        logits = output.split(batch)
        for i, req in enumerate(reqs):
            span, streams = batch.spans[i], per_token[batch.offsets[i] :][: len(chunks[i])]
            if rows[i]:
                self._verify(req, span, chunks[i], logits[i], streams, result)
                continue
            for view in output.states_at[i]:
                runner.record_block(req, view)
            self._prefill(req, span, logits[i], streams, result)
            runner.maybe_record(req)
        self._draft(result)
        return result

    def _prefill(
        self, req: Request, span: SequenceSpan, logits: Tensor, streams: Tensor, result: SpecStep
    ) -> None:
        """A chunk of the prompt (or of tokens recomputed after a preemption): its positions
        wait for the drafter; the last one of the sequence draws the next token."""
        start, n = span.start, span.num_tokens
        pending = self._pending(req)
        result.num_computed[req] = start + n
        pending.streams.append(streams)
        after = req.all_token_ids[start + 1 : start + n + 1]
        if start + n < req.num_tokens:
            pending.next_ids += after
            return
        token, logprob = self._sample(req, logits[-1], start + n)
        pending.next_ids += [*after, token]
        result.tokens[req] = [(token, logprob)]

    def _verify(  # noqa: PLR0917
        self,
        req: Request,
        span: SequenceSpan,
        ids: Tensor,
        logits: Tensor,
        streams: Tensor,
        result: SpecStep,
    ) -> None:
        """A verification row: keep the drafts that pass, draw the token after them, roll
        the state back to what was kept. Drafts after a stop token or one the grammar rejects
        are not verified (:mod:`.spec_sampling`): they count as rejected."""
        start = span.start
        pending = self._pending(req)
        offered = ids.numel() - 1
        target = self._target(req, logits, ids[1:].tolist())
        drafts = torch.tensor(target.drafts, dtype=torch.long)
        n_kept, dist = verify_sequence(target.probs, None, drafts, req.seed, start)
        token = self._draw(req, dist, start + n_kept + 1)
        emitted = [*target.drafts[:n_kept], token]
        result.tokens[req] = target.emit(req, emitted)
        self.num_drafts += offered
        self.num_accepted += n_kept
        metrics = req.metrics
        metrics.spec_rounds += 1
        metrics.spec_draft_tokens += offered
        metrics.spec_accepted_tokens += n_kept
        per = metrics.spec_accepted_per_position
        per += [0] * (offered - len(per))
        for j in range(n_kept):
            per[j] += 1
        assert req.state is not None
        self.model.rollback(req.state, start + n_kept + 1, req.all_token_ids + emitted[:-1])
        result.num_computed[req] = start + n_kept + 1
        pending.streams.append(streams[: n_kept + 1])
        pending.next_ids += emitted

    def _target(self, req: Request, logits: Tensor, offered: list[int]) -> PositionTargets:
        """The request's sampling distributions at the positions of ``logits`` (row j: after
        ``offered[:j]``), each processed as the sampler would process a draw there."""
        cfg = self.model.cfg
        eos = eos_ids(cfg.eos_token_id)
        return position_targets(req, offered, logits, eos, cfg.image_token_id)

    def _draw(self, req: Request, dist: Tensor, position: int) -> int:
        """The token at ``position`` from ``dist`` [V], with the sampler's noise there."""
        uniform = self.model.ops.sampling_uniform
        return draw(dist, req.params.temperature, req.seed, position, uniform)

    def _sample(self, req: Request, logits: Tensor, position: int) -> tuple[int, float]:
        """The first token after the prompt, as the sampler would draw it."""
        target = self._target(req, logits[None], [])
        return target.emit(req, [self._draw(req, target.probs[0], position)])[0]

    def _draft(self, result: SpecStep) -> None:
        """Draft the next round for every request that emitted tokens this step, in one
        batched pass of the speculator; at most what the request may still generate."""
        reqs = [r for r in result.tokens if r.state is not None]
        if not reqs:
            return
        pieces = [self.pending.pop(r) for r in reqs]
        streams = torch.cat([s for p in pieces for s in p.streams])
        next_ids = torch.tensor([t for p in pieces for t in p.next_ids], device=streams.device)
        lengths = [len(p.next_ids) for p in pieces]
        states = [r.state for r in reqs]
        if self.verifier is not None:  # the drafts and, for the schedule, their confidences
            drafts = self.verifier.draft(self.drafter, reqs, states, streams, next_ids, lengths)  # type: ignore[arg-type]
        else:
            drafts = self.drafter.draft_batch(states, streams, next_ids, lengths).tolist()  # type: ignore[arg-type]
        for req, row in zip(reqs, drafts, strict=True):
            room = req.max_total_tokens - req.num_tokens - len(result.tokens[req])
            kept = row[: row.index(-1)] if -1 in row else row  # -1: not worth verifying
            self.drafts[req] = kept[: max(0, room)]
