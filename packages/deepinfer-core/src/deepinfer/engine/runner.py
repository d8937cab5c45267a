"""Runs one scheduled step: one model forward over every scheduled span, then one batched sample.

The runner reads the scheduler's output (never writes it), describes the step as one
:class:`~deepinfer.models.batch.ForwardBatch` (decode rows first, then prefill chunks; prompt
logprobs keep every position's logits; the prefix cache's block ends inside a chunk are record
points), runs ``model(batch)``, records the blocks the step completed, and returns a
:class:`ModelRunnerOutput` that the scheduler applies: the scheduler is the only writer of a
request's progress. The sampler then draws for every request that reached the end of its known
tokens in one batched call.

In batch-invariant mode every token runs through the model on its own, so a request's logits
never depend on its batch neighbours (a batched decode sums in a batch-dependent order).

Sampling is split in two for asynchronous scheduling: :meth:`ModelRunner.launch_sample` queues
the draw and the copy of its results to the host and returns a :class:`PendingSample` at once;
its :meth:`~PendingSample.resolve` waits for the copy. Until then the sampled tokens exist only
on the device, and the next decode step takes its input ids from there.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch
from torch import Tensor

from deepinfer.cache.prefix import BLOCK_SIZE, PrefixCache, Snapshot
from deepinfer.engine.request import Request
from deepinfer.engine.sampling_rows import (
    SamplingRow,
    plain_draws,
    position_tensors,
    sampling_tensors,
)
from deepinfer.engine.scheduler import SchedulerOutput
from deepinfer.models.batch import ForwardBatch, SequenceSpan
from deepinfer.models.causal_lm import DeepseekCausalLM
from deepinfer.models.graphs import DecodeGraphs
from deepinfer.models.state import ModelState
from deepinfer.outputs import Logprobs
from deepinfer.sampling import SamplingTensors, sample
from deepinfer.transfer import to_device

#: Requests due a token and their last-position logits [n, V], in the batches the model made
#: them (one stack of rows per decode step, so sampling needs no per-row gather).
Due = list[tuple[list[Request], Tensor]]


@dataclass
class ModelRunnerOutput:
    """What a step did, for the scheduler to apply: it alone writes request progress."""

    #: Tokens now in each scheduled request's state.
    num_computed: dict[Request, int] = field(default_factory=dict)
    due: Due = field(default_factory=list)


@dataclass
class SampledToken:
    request: Request
    token_id: int
    logprob: float
    top: Logprobs | None  # sampled token and the requested top alternatives


@dataclass
class PendingSample:
    """One step's draws, on their way to the host."""

    requests: list[Request]
    #: [n] on the model's device: the next decode step gathers its input ids from here.
    token_ids: Tensor
    #: Host copies of (token ids, logprobs, top ids, top logprobs), filled asynchronously.
    host: list[Tensor | None]
    done: torch.cuda.Event | None

    @functools.cached_property
    def rows(self) -> dict[Request, int]:
        """Each request's row in ``token_ids`` (built only when a decode step needs it)."""
        return {r: i for i, r in enumerate(self.requests)}

    def resolve(self) -> list[SampledToken]:
        """Wait for the copies; the requests' tokens as the host sees them."""
        if self.done is not None:
            self.done.synchronize()
        tokens, logprobs, top_ids, top_lps = (
            t.tolist() if t is not None else None for t in self.host
        )
        assert tokens is not None and logprobs is not None
        out: list[SampledToken] = []
        for i, req in enumerate(self.requests):
            top: Logprobs | None = None
            if req.params.logprobs is not None:
                top = {tokens[i]: logprobs[i]}  # logprobs=0: the sampled token's alone
                for j in range(req.params.logprobs):
                    assert top_ids is not None and top_lps is not None
                    top.setdefault(top_ids[i][j], top_lps[i][j])
            out.append(SampledToken(req, tokens[i], logprobs[i], top))
        return out


def _to_host(t: Tensor | None) -> Tensor | None:
    """A copy of ``t`` on the host; from a GPU, into pinned memory without waiting for it."""
    if t is None or t.device.type == "cpu":
        return t
    if t.device.type != "cuda":
        return t.cpu()
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    return host.copy_(t, non_blocking=True)


class ModelRunner:
    def __init__(
        self,
        model: DeepseekCausalLM,
        eos_token_ids: set[int],
        prefix_cache: PrefixCache | None = None,
        batch_invariant: bool = False,
        graphs: DecodeGraphs | None = None,
    ) -> None:
        self.model = model
        self.batch_invariant = batch_invariant
        self.graphs = graphs
        self.vocab_size = model.cfg.vocab_size
        self.eos_token_ids = eos_token_ids
        self.prefix_cache = prefix_cache
        #: The image placeholder is never sampled: the vision tower runs outside the engine, so
        #: a generated one could not be fed back (its embedding would be missing).
        self.image_token_id = model.cfg.image_token_id
        self._image_index: Tensor | None = None
        #: The latest draws; decode rows whose input token is still in flight read it here.
        self.last_sample: PendingSample | None = None

    def execute(self, out: SchedulerOutput) -> ModelRunnerOutput:
        """Run the scheduled spans; the scheduler applies the returned progress."""
        result = ModelRunnerOutput()
        if not out.scheduled:  # every request waits for a token in flight: nothing to run
            return result
        if self.batch_invariant:
            for req, n in out.scheduled.items():
                logits = self._one_by_one(req, n)
                result.num_computed[req] = req.num_computed_tokens + n
                if req.num_computed_tokens + n == req.num_tokens:
                    result.due.append(([req], logits[None]))
            return result
        batch, reqs = self._build_batch(out.scheduled)
        output = self.model(batch, self.graphs)
        all_decode = len(batch.decode_rows) == len(batch.spans)
        if all_decode:  # the common decode step: its logits are one stack of rows already
            result.due.append((reqs, output.logits))
        per_span = [] if all_decode else output.split(batch)
        for i, (req, span) in enumerate(zip(reqs, batch.spans, strict=True)):
            for view in output.states_at[i]:
                self.record_block(req, view)
            end = span.start + span.num_tokens
            result.num_computed[req] = end
            self.maybe_record(req)
            if all_decode:
                continue
            logits = per_span[i]
            if req.prompt_logprobs is not None:
                self._prompt_logprobs(req, span.start, logits)
            if end == req.num_tokens:
                result.due.append(([req], logits[-1:]))
        return result

    def _build_batch(self, scheduled: dict[Request, int]) -> tuple[ForwardBatch, list[Request]]:
        """The step's batch: decode rows first (their ids may still be on the device, where
        the previous step drew them), then every other span with its tokens from the host."""
        decode = [r for r, n in scheduled.items() if self._is_decode(r, n)]
        decoding = set(decode)
        others = [r for r in scheduled if r not in decoding]
        spans, pieces = [], []
        if decode:
            pieces.append(self._decode_ids(decode))
        for req in decode:
            assert req.state is not None
            spans.append(SequenceSpan.decode_row(req.state))
        for req in others:
            start, n = req.num_computed_tokens, scheduled[req]
            assert req.state is not None
            # A prefill never reaches a token still in flight (the scheduler waits for it).
            ids = req.all_token_ids[start : start + n]
            assert len(ids) == n
            pieces.append(torch.tensor(ids, dtype=torch.long))
            keep = n if req.prompt_logprobs is not None else 1
            spans.append(
                SequenceSpan.new(req.state, n, keep, tuple(self.boundaries(req, start + n)))
            )
        device = pieces[0].device
        ids = torch.cat([to_device(p, device) for p in pieces]) if len(pieces) > 1 else pieces[0]
        return ForwardBatch(ids, tuple(spans)), [*decode, *others]

    @staticmethod
    def _is_decode(req: Request, n: int) -> bool:
        """One generated token to feed."""
        return (
            n == 1
            and req.num_computed_tokens >= req.num_prompt_tokens
            and req.num_computed_tokens + 1 == req.num_tokens
        )

    def _decode_ids(self, reqs: list[Request]) -> Tensor:
        """The token each decode row feeds: from the host, or, while it is in flight, from the
        last sample's device tensor (no wait for the step that drew it)."""
        host = [0] * len(reqs)
        rows = [-1] * len(reqs)
        for i, r in enumerate(reqs):
            if r.num_inflight:
                assert self.last_sample is not None
                rows[i] = self.last_sample.rows[r]
            else:
                host[i] = r.output_token_ids[r.num_computed_tokens - r.num_prompt_tokens]
        if self.last_sample is None or max(rows) < 0:
            return torch.tensor(host)
        drawn = self.last_sample.token_ids
        index = to_device(torch.tensor(rows), drawn.device)
        gathered = drawn[index.clamp(min=0)]
        if min(rows) >= 0:
            return gathered
        return torch.where(index >= 0, gathered, to_device(torch.tensor(host), drawn.device))

    def boundaries(self, req: Request, end: int) -> list[int]:
        """The block boundaries strictly inside the request's next chunk (none without a
        prefix cache)."""
        if self.prefix_cache is None:
            return []
        first = (req.num_computed_tokens // BLOCK_SIZE + 1) * BLOCK_SIZE
        return list(range(first, end, BLOCK_SIZE))

    def maybe_record(self, req: Request) -> None:
        """Record the block that ends where the request's state now stands, if one does."""
        state = req.state
        if self.prefix_cache is not None and state is not None and state.pos % BLOCK_SIZE == 0:
            self.record_block(req, state)

    def _one_by_one(self, req: Request, n: int) -> Tensor:
        """Batch-invariant mode: every token runs through the model on its own, so a request's
        logits never depend on its batch neighbours (a batched decode sums in a
        batch-dependent order). Returns the last position's logits."""
        state = req.state
        assert state is not None
        tokens = req.all_token_ids
        end = req.num_computed_tokens + n
        last: Tensor | None = None
        while state.pos < end:
            start = state.pos
            ids = torch.tensor([tokens[start : start + 1]], dtype=torch.long)
            logits = self.model(ForwardBatch.of(ids, state)).logits
            if req.prompt_logprobs is not None:
                self._prompt_logprobs(req, start, logits)
            last = logits[-1]
            self.maybe_record(req)
        assert last is not None
        return last

    def record_block(self, req: Request, state: ModelState | Snapshot) -> None:
        """Record the block that ends at ``state``: the request's state there (its own, or a
        view of it at a boundary inside the chunk just run), or the snapshot taken there while
        the block's last token was in flight (the engine calls this once it is read)."""
        cache = self.prefix_cache
        assert cache is not None
        parent = req.cache_block
        if parent is not None and parent not in cache:
            return  # the chain was evicted under us; this request stops contributing
        tokens = req.all_token_ids
        end = state.end if isinstance(state, Snapshot) else state.pos
        if len(tokens) < end:  # the block ends with a token still in flight: key it once read
            assert isinstance(state, ModelState)
            req.pending_block = cache.snapshot(parent, state)
            return
        req.cache_block = cache.insert(parent, tokens[end - BLOCK_SIZE : end], state)

    def _prompt_logprobs(self, req: Request, start: int, logits: Tensor) -> None:
        """Logprob of each prompt token given the tokens before it (None for the first)."""
        assert req.prompt_logprobs is not None
        k = req.params.prompt_logprobs or 0
        prompt = req.prompt_token_ids
        if start == 0:
            req.prompt_logprobs.append(None)
        logp = torch.log_softmax(logits.float(), dim=-1)
        for row in range(logits.shape[0]):
            target = start + row + 1
            if target >= len(prompt):
                break
            req.prompt_logprobs.append(logprob_entry(logp[row], prompt[target], k))

    def launch_sample(self, due: Due) -> PendingSample | None:
        """Queue the draws for ``due`` and their copy to the host; returns without waiting.

        The requests' tokens count as in flight until the engine reads them; the next decode
        step takes them from this sample's device tensor.
        """
        if not due:
            return None
        reqs = [r for batch, _ in due for r in batch]
        logits = due[0][1] if len(due) == 1 else torch.cat([rows for _, rows in due])
        logits = logits.float()
        if self.image_token_id is not None and self.image_token_id < logits.shape[-1]:
            # Out of place: the rows may be a captured graph's output buffer.
            if self._image_index is None or self._image_index.device != logits.device:
                self._image_index = torch.tensor([self.image_token_id], device=logits.device)
            logits = logits.index_fill(-1, self._image_index, float("-inf"))
        tensors = self._sampling_tensors(reqs, logits.device)
        k = max((r.params.logprobs or 0) for r in reqs)
        result = sample(logits, tensors, num_logprobs=k, ops=self.model.ops)
        # One device-to-host copy per result tensor, not one per request and value.
        host = [
            _to_host(t)
            for t in (result.token_ids, result.logprobs, result.top_ids, result.top_logprobs)
        ]
        done = None
        if logits.device.type == "cuda":
            done = torch.cuda.Event()
            done.record()
        for req in reqs:
            req.num_inflight += 1
        self.last_sample = PendingSample(reqs, result.token_ids, host, done)
        return self.last_sample

    def _sampling_tensors(self, reqs: list[Request], device: torch.device) -> SamplingTensors:
        if plain_draws(reqs):  # no row processes its logits: built column by column
            return position_tensors(reqs, [1] * len(reqs), device)
        rows = [
            SamplingRow.of(r, grammar=r.grammar.allowed() if r.grammar is not None else None)
            for r in reqs
        ]
        return sampling_tensors(rows, self.vocab_size, self.eos_token_ids, device)


def logprob_entry(logp: Tensor, token: int, k: int) -> Logprobs:
    """The logprob of ``token`` and of the ``k`` most likely tokens (ties: lower id first), in
    the form requests report them: one entry of ``logprobs`` or ``prompt_logprobs``."""
    entry = {token: float(logp[token])}
    if k:
        top = torch.sort(-logp, stable=True).indices[:k]
        for t in top.tolist():
            entry.setdefault(int(t), float(logp[t]))
    return entry
