"""Runs one scheduled step: model forwards for every scheduled span, then one batched sample.

States are per-request objects. Requests that decode one token go through the model together
(``forward_decode``: one pass over the layers for the whole batch, each row at its own position);
prefill chunks of all other requests are packed into one forward (``forward_packed_at``,
which runs sequences at one position with chunks of similar length as one lockstep batch).
The sampler then draws for every request that reached the end of its known tokens in one
batched call. With the prefix cache on, the packed forward also hands back each request's
state at the 128-token boundaries inside its chunk (copies taken as the layers pass them),
so recording the blocks costs no cut.

In batch-invariant mode every token runs through the model on its own, so a request's logits
never depend on its batch neighbours (a batched decode sums in a batch-dependent order).

Sampling is split in two for asynchronous scheduling: :meth:`ModelRunner.launch_sample` queues
the draw and the copy of its results to the host and returns a :class:`PendingSample` at once;
its :meth:`~PendingSample.resolve` waits for the copy. Until then the sampled tokens exist only
on the device, and the next decode step takes its input ids from there.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import Tensor

from deepinfer.cache.prefix import BLOCK_SIZE, PrefixCache, Snapshot
from deepinfer.engine.request import Request
from deepinfer.engine.scheduler import SchedulerOutput
from deepinfer.models.deepseek_v4 import DeepseekV4ForCausalLM
from deepinfer.models.graphs import DecodeGraphs
from deepinfer.models.state import ModelState
from deepinfer.outputs import Logprobs
from deepinfer.sampling import SamplingTensors, sample
from deepinfer.transfer import to_device

#: Requests due a token and their last-position logits [n, V], in the batches the model made
#: them (one stack of rows per decode step, so sampling needs no per-row gather).
Due = list[tuple[list[Request], Tensor]]


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
        model: DeepseekV4ForCausalLM,
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

    def execute(self, out: SchedulerOutput) -> Due:
        """Run the model; return the last-position logits of the requests due a token."""
        due: Due = []
        if self.batch_invariant:
            for req, n in out.scheduled.items():
                logits = self._advance(req, n)
                if req.num_computed_tokens == req.num_tokens:
                    due.append(([req], logits[None]))
            return due
        decode = [r for r, n in out.scheduled.items() if self._is_decode(r, n)]
        # A lone decode token runs as a one-token chunk, except with graphs (where the decode
        # step of even one row is captured) or while the token is still on the device.
        if len(decode) >= 2 or (decode and (self.graphs is not None or decode[0].num_inflight)):
            due.append(self._decode(decode))
        else:
            decode = []
        batched = set(decode)
        chunks = {r: n for r, n in out.scheduled.items() if r not in batched}
        for req, n in chunks.items():
            if req.prompt_logprobs is not None:  # needs every position's logits
                logits = self._advance(req, n)
                if req.num_computed_tokens == req.num_tokens:
                    due.append(([req], logits[None]))
        packed = {
            r: r.num_computed_tokens + n for r, n in chunks.items() if r.prompt_logprobs is None
        }
        if packed:
            due.extend(self._prefill(packed))
        return due

    @staticmethod
    def _is_decode(req: Request, n: int) -> bool:
        """One generated token to feed."""
        return (
            n == 1
            and req.num_computed_tokens >= req.num_prompt_tokens
            and req.num_computed_tokens + 1 == req.num_tokens
        )

    def _decode(self, reqs: list[Request]) -> tuple[list[Request], Tensor]:
        """All single-token rows in one batched pass, each at its own position."""
        states = [r.state for r in reqs]
        assert all(s is not None for s in states)
        logits = self.model.forward_decode(self._decode_ids(reqs), states, self.graphs)  # type: ignore[arg-type]
        for req in reqs:
            req.num_computed_tokens += 1
            self._maybe_record(req)
        return reqs, logits

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

    def _prefill(self, ends: dict[Request, int]) -> Due:
        """Advance every request to its scheduled end with one packed forward.

        With the prefix cache on, the forward also returns each request's state at the
        128-token boundaries inside its chunk, and those blocks are recorded.
        """
        reqs = list(ends)
        chunks = [torch.tensor(r.all_token_ids[r.num_computed_tokens : ends[r]]) for r in reqs]
        # A prefill never reaches a token still in flight (the scheduler waits for it).
        assert all(
            c.numel() == ends[r] - r.num_computed_tokens for c, r in zip(chunks, reqs, strict=True)
        )
        states = [r.state for r in reqs]
        marks = [self._boundaries(r, ends[r]) for r in reqs]
        logits, views = self.model.forward_packed_at(chunks, states, marks)  # type: ignore[arg-type]
        due: Due = []
        for i, req in enumerate(reqs):
            for view in views[i]:
                self.record_block(req, view)
            req.num_computed_tokens = ends[req]
            self._maybe_record(req)
            if ends[req] == req.num_tokens:
                due.append(([req], logits[i : i + 1]))
        return due

    def _boundaries(self, req: Request, end: int) -> list[int]:
        """The block boundaries strictly inside the request's next chunk (none without a
        prefix cache)."""
        if self.prefix_cache is None:
            return []
        first = (req.num_computed_tokens // BLOCK_SIZE + 1) * BLOCK_SIZE
        return list(range(first, end, BLOCK_SIZE))

    def _piece_end(self, req: Request, end: int) -> int:
        """Where a per-request forward stops: the first block boundary before ``end``."""
        return next(iter(self._boundaries(req, end)), end)

    def _maybe_record(self, req: Request) -> None:
        if self.prefix_cache is not None and req.num_computed_tokens % BLOCK_SIZE == 0:
            assert req.state is not None
            self.record_block(req, req.state)

    def _advance(self, req: Request, n: int) -> Tensor:
        """Per-request forwards (batch-invariant mode, prompt logprobs)."""
        assert req.state is not None
        tokens = req.all_token_ids
        end = req.num_computed_tokens + n
        last: Tensor | None = None
        while req.num_computed_tokens < end:
            start = req.num_computed_tokens
            stop = start + 1 if self.batch_invariant else self._piece_end(req, end)
            ids = torch.tensor([tokens[start:stop]], dtype=torch.long)
            logits = self.model(ids, req.state)[0]
            if req.prompt_logprobs is not None:
                self._prompt_logprobs(req, start, logits)
            req.num_computed_tokens = stop
            last = logits[-1]
            self._maybe_record(req)
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
            req.prompt_logprobs.append(_logprob_entry(logp[row], prompt[target], k))

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
        def col(values: list[float] | list[int], dtype: torch.dtype) -> Tensor:
            return to_device(torch.tensor(values, dtype=dtype), device)

        ps = [r.params for r in reqs]
        t = SamplingTensors(
            temperature=col([p.temperature for p in ps], torch.float32),
            top_k=col([p.top_k if p.top_k > 0 else 0 for p in ps], torch.int64),
            top_p=col([p.top_p for p in ps], torch.float32),
            min_p=col([p.min_p for p in ps], torch.float32),
            seeds=col([r.seed for r in reqs], torch.int64),
            positions=col([r.num_tokens for r in reqs], torch.int64),
            sampled_rows=col([i for i, p in enumerate(ps) if p.temperature > 0], torch.int64),
            any_top_k_top_p=any(p.temperature > 0 and (p.top_k > 0 or p.top_p < 1) for p in ps),
        )
        if any(p.penalized for p in ps):
            counts = torch.zeros(len(reqs), self.vocab_size, dtype=torch.int64, device=device)
            prompt = torch.zeros(len(reqs), self.vocab_size, dtype=torch.bool, device=device)
            for i, r in enumerate(reqs):
                if r.output_token_ids:
                    counts[i] = torch.bincount(
                        col(r.output_token_ids, torch.int64), minlength=self.vocab_size
                    )
                prompt[i, col(r.prompt_token_ids, torch.int64)] = True
            t.output_counts, t.prompt_mask = counts, prompt
            t.presence_penalty = col([p.presence_penalty for p in ps], torch.float32)
            t.frequency_penalty = col([p.frequency_penalty for p in ps], torch.float32)
            t.repetition_penalty = col([p.repetition_penalty for p in ps], torch.float32)
        if any(p.logit_bias for p in ps):
            bias = torch.zeros(len(reqs), self.vocab_size, dtype=torch.float32)
            for i, p in enumerate(ps):
                if p.logit_bias:
                    bias[i, list(p.logit_bias)] = torch.tensor(
                        list(p.logit_bias.values()), dtype=torch.float32
                    )
            t.logit_bias = to_device(bias, device)
        banned = [self._banned(r) for r in reqs]
        only = [p.allowed_token_ids for p in ps]
        if any(banned) or any(only) or any(r.grammar is not None for r in reqs):
            allowed = torch.ones(len(reqs), self.vocab_size, dtype=torch.bool, device=device)
            for i, (req, ids) in enumerate(zip(reqs, banned, strict=True)):
                if only[i]:
                    allowed[i] = False
                    allowed[i, col(only[i], torch.int64)] = True
                # Bans (min_tokens' stop tokens, bad words) yield when nothing else is allowed.
                if ids and not (only[i] and ids.issuperset(only[i])):
                    allowed[i, col(sorted(ids), torch.int64)] = False
                if req.grammar is not None:
                    grammar = req.grammar.allowed().to(device)
                    # The grammar wins when it allows nothing but a banned stop token.
                    both = grammar & allowed[i]
                    allowed[i] = both if bool(both.any()) else grammar
            t.allowed = allowed
        return t

    def _banned(self, req: Request) -> set[int]:
        """Stop tokens until ``min_tokens`` tokens have been generated, and the last token of
        each bad word whose other tokens end the output so far."""
        banned: set[int] = set()
        if req.num_output_tokens < req.params.min_tokens:
            banned |= set(req.params.stop_token_ids)
            if not req.params.ignore_eos:
                banned |= self.eos_token_ids
        out = req.output_token_ids
        for seq in req.bad_words:
            *head, last = seq
            if not head or (len(out) >= len(head) and out[len(out) - len(head) :] == head):
                banned.add(last)
        return {t for t in banned if t < self.vocab_size}


def _logprob_entry(logp: Tensor, token: int, k: int) -> Logprobs:
    entry = {token: float(logp[token])}
    if k:
        top = torch.sort(-logp, stable=True).indices[:k]
        for t in top.tolist():
            entry.setdefault(int(t), float(logp[t]))
    return entry
