"""One rank's part of a global step: exactly one model forward, whatever its requests.

Every MoE layer under expert parallelism is a collective, so the ranks' forwards must pair up
one for one. A rank runs its engine's step when it has work and checks that the step ran the
model exactly once; a rank with no work, or whose step ran nothing (only preemptions, say),
runs a dummy forward of one token on a scratch state instead, as vLLM's idle ranks do. The
model's forward is wrapped to count calls and to catch its failures: the engine recovers from a
failed step on its own, but under data parallelism a forward that failed may have left the
other ranks inside a collective, so the failure ends the run instead. The wrapper also has the
ranks agree, before each forward, on the most tokens any of them feeds it, which picks the MoE
layers' exchange for that forward (:meth:`~deepinfer.parallel.ExpertParallel.agree`), rounded
up to a decode-graph batch bucket: every rank's forward then runs at the rows of a captured graph
(its own, padded, or an eager step at the same rows), so their collectives match.

Decode graphs missing under expert parallelism (past the entries captured at startup) are
captured at the start of a step, every rank together (:meth:`~deepinfer.models.graphs.
DecodeGraphs.capture_wanted`; a rank with nothing to capture runs :meth:`RankStepper.
capture_partner` forwards beside the others' warm-ups).

MTP speculation adds passes of the MTP layer, whose MoE is a collective too: a rank that drafts
agrees on its ``k`` passes from inside its step (:meth:`~deepinfer.parallel.ExpertParallel.
agree_passes`); a rank whose step drafted nothing agrees on none after it, and runs as many dummy
passes (one token through the MTP layer on a scratch state) as the others draft.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from deepinfer.cache.prefix import BLOCK_SIZE
from deepinfer.dp.protocol import RankMetrics, StepCommand, StepReply
from deepinfer.engine.engine import LLMEngine
from deepinfer.engine.spec_config import SpeculativeConfig
from deepinfer.errors import DeepInferError
from deepinfer.models.batch import ForwardBatch
from deepinfer.models.expert_load import ExpertLoadTracker
from deepinfer.models.graphs import decode_buckets, round_to_bucket
from deepinfer.models.state import ModelState
from deepinfer.parallel import find_expert_parallel


class LockstepError(DeepInferError):
    """A rank's step broke the one-forward-per-step rule or its forward failed."""


class RankStepper:
    """Runs ``engine``'s steps for rank ``rank`` in lockstep with the other ranks."""

    def __init__(self, engine: LLMEngine, rank: int) -> None:
        self.engine = engine
        self.rank = rank
        self.forwards = 0
        self.error: BaseException | None = None
        self.steps = 0
        self.dummy_steps = 0
        self._scratch: ModelState | None = None
        self._mtp_scratch: ModelState | None = None
        model = engine.model
        self.expert_load = ExpertLoadTracker(model)
        inner: Callable[..., Any] = model.forward
        self._inner = inner
        self.ep = ep = find_expert_parallel(model)
        spec = SpeculativeConfig.parse(engine.config.speculative_config)
        #: whether steps may draft through the MTP layer (passes every rank must match)
        self.mtp_passes = ep is not None and spec is not None and spec.method == "mtp"
        buckets = decode_buckets(engine.config.max_num_seqs)

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.forwards += 1
            try:
                if ep is None:
                    return inner(*args, **kwargs)
                batch: ForwardBatch = args[0] if args else kwargs["batch"]
                # rounded to a decode-graph bucket: every rank's graph at the agreed rows
                with ep.forward(batch.num_tokens, lambda n: round_to_bucket(n, buckets)):
                    return inner(*args, **kwargs)
            except BaseException as exc:
                self.error = exc
                raise

        model.forward = counted  # type: ignore[method-assign]

    @torch.inference_mode()
    def dummy_forward(self) -> None:
        """One token through the model on a scratch state (renewed every block, so it stays
        small); its logits are dropped, its MoE layers meet the other ranks'."""
        self._one_token(self.engine.model)
        self.dummy_steps += 1

    @torch.inference_mode()
    def capture_partner(self) -> None:
        """:meth:`dummy_forward` at the rows the ranks agreed on (set by the caller), neither
        counted as the step's forward nor agreed on again: the partner of another rank's graph
        warm-up (:meth:`~deepinfer.models.graphs.DecodeGraphs.capture_wanted`)."""
        self._one_token(self._inner)

    def _one_token(self, forward: Callable[..., Any]) -> None:
        """``forward`` of one token on the scratch state, outside the expert-load counts."""
        if self._scratch is None or self._scratch.pos >= BLOCK_SIZE:
            self._scratch = self.engine.model.new_state(1)
        with self.expert_load.paused():
            forward(ForwardBatch.of(torch.zeros(1, 1, dtype=torch.long), self._scratch))

    @torch.inference_mode()
    def match_draft_passes(self) -> None:
        """After the step: if it drafted nothing, agree on no drafting passes and run as many
        dummy passes of the MTP layer as the ranks that drafted ran (see the module)."""
        ep = self.ep
        if not self.mtp_passes or ep is None:
            return
        if ep.step.passes_agreed:  # agreed from inside the step's drafting
            ep.step.passes_agreed = False
            return
        model = self.engine.model
        cfg = model.cfg
        streams = torch.zeros(
            1, 1, cfg.hc_mult, cfg.hidden_size, dtype=model.dtype, device=model.device
        )
        ids = torch.zeros(1, 1, dtype=torch.long)
        for _ in range(ep.agree_passes(0)):
            if self._mtp_scratch is None or self._mtp_scratch.mtp_pos >= BLOCK_SIZE:
                self._mtp_scratch = model.new_state(1)
            with ep.forward(1), self.expert_load.paused():
                model.mtp_forward(streams, ids, self._mtp_scratch)
        ep.step.passes_agreed = False

    def run(self, command: StepCommand) -> StepReply:
        """Apply the command's requests, run one step (or the dummy forward), report."""
        engine = self.engine
        if command.keepalive:
            return StepReply(metrics=self.metrics())
        if command.report_only:
            return StepReply(metrics=self.metrics(expert_load=True))
        reply = StepReply()
        if command.reset_prefix_cache:
            engine.reset_prefix_cache()
        for request_id in command.abort:
            out = engine.abort_request(request_id)
            if out is not None:
                reply.outputs.append(out)
        if command.new:
            built = [
                engine.make_request(
                    s.prompt_token_ids, s.params, s.request_id, prompt=s.prompt, priority=s.priority
                )
                for s in command.new
            ]
            engine.submit(built)
        graphs = engine.runner.graphs
        if graphs is not None and self.ep is not None:  # graphs a step wanted, captured together
            graphs.capture_wanted(self.capture_partner)
        before = self.forwards
        if engine.has_unfinished_requests():
            reply.outputs += engine.step(final_only=command.final_only, watch=command.watch)
        if self.error is not None:
            raise LockstepError(f"rank {self.rank}: the model's forward failed") from self.error
        ran = self.forwards - before
        if ran == 0:
            self.dummy_forward()
        elif ran > 1:
            raise LockstepError(f"rank {self.rank} ran {ran} forwards in one step (1 expected)")
        self.match_draft_passes()
        self.steps += 1
        reply.metrics = self.metrics()
        return reply

    def metrics(self, expert_load: bool = False) -> RankMetrics:
        """This rank's metrics; the expert load (a device sync) only when asked for."""
        engine = self.engine
        cache = engine.prefix_cache
        return RankMetrics(
            rank=self.rank,
            waiting=len(engine.scheduler.waiting),
            running=len(engine.scheduler.running),
            prefix_cache_hit_rate=cache.stats.hit_rate if cache is not None else 0.0,
            dummy_steps=self.dummy_steps,
            steps=self.steps,
            expert_load=self.expert_load.read() if expert_load else {},
        )
