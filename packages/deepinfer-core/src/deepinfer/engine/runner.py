"""Runs one scheduled step: model forwards for every scheduled span, then one batched sample.

The reference runner advances each request's state with its own forward call (states are
per-request objects), so a request's logits never depend on its batch neighbours; the sampler
then draws for every request that reached the end of its known tokens in one batched call. With
the prefix cache on, spans are cut at 128-token boundaries so the state at each boundary can be
recorded; the model is chunking-invariant, so the cut does not change any logits.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from deepinfer.cache.prefix import BLOCK_SIZE, PrefixCache
from deepinfer.engine.request import Request
from deepinfer.engine.scheduler import SchedulerOutput
from deepinfer.models.deepseek_v4 import DeepseekV4ForCausalLM
from deepinfer.outputs import Logprobs
from deepinfer.sampling import SamplingTensors, sample


@dataclass
class SampledToken:
    request: Request
    token_id: int
    logprob: float
    top: Logprobs | None  # sampled token and the requested top alternatives


class ModelRunner:
    def __init__(
        self,
        model: DeepseekV4ForCausalLM,
        eos_token_ids: set[int],
        prefix_cache: PrefixCache | None = None,
        batch_invariant: bool = False,
    ) -> None:
        self.model = model
        self.batch_invariant = batch_invariant
        self.vocab_size = model.cfg.vocab_size
        self.eos_token_ids = eos_token_ids
        self.prefix_cache = prefix_cache

    def execute(self, out: SchedulerOutput) -> list[tuple[Request, Tensor]]:
        """Run the model; return (request, last-position logits) for requests due a token."""
        due: list[tuple[Request, Tensor]] = []
        for req, n in out.scheduled.items():
            logits = self._advance(req, n)
            if req.num_computed_tokens == req.num_tokens:
                due.append((req, logits))
        return due

    def _advance(self, req: Request, n: int) -> Tensor:
        assert req.state is not None
        tokens = req.all_token_ids
        end = req.num_computed_tokens + n
        last: Tensor | None = None
        while req.num_computed_tokens < end:
            start = req.num_computed_tokens
            stop = end
            if self.batch_invariant:
                stop = start + 1
            elif self.prefix_cache is not None:
                stop = min(end, (start // BLOCK_SIZE + 1) * BLOCK_SIZE)
            ids = torch.tensor([tokens[start:stop]], dtype=torch.long)
            logits = self.model(ids, req.state)[0]
            if req.prompt_logprobs is not None:
                self._prompt_logprobs(req, start, logits)
            req.num_computed_tokens = stop
            last = logits[-1]
            if self.prefix_cache is not None and stop % BLOCK_SIZE == 0:
                self._record_block(req, tokens)
        assert last is not None
        return last

    def _record_block(self, req: Request, tokens: list[int]) -> None:
        cache = self.prefix_cache
        assert cache is not None and req.state is not None
        parent = req.cache_block
        if parent is not None and parent not in cache:
            return  # the chain was evicted under us; this request stops contributing
        end = req.num_computed_tokens
        req.cache_block = cache.insert(parent, tokens[end - BLOCK_SIZE : end], req.state)

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

    def sample(self, due: list[tuple[Request, Tensor]]) -> list[SampledToken]:
        if not due:
            return []
        reqs = [r for r, _ in due]
        logits = torch.stack([row for _, row in due]).float()
        tensors = self._sampling_tensors(reqs, logits.device)
        k = max((r.params.logprobs or 0) for r in reqs)
        result = sample(logits, tensors, num_logprobs=k)
        out: list[SampledToken] = []
        for i, req in enumerate(reqs):
            token = int(result.token_ids[i])
            top: Logprobs | None = None
            if req.params.logprobs is not None:
                top = {token: float(result.logprobs[i])}
                assert result.top_ids is not None and result.top_logprobs is not None
                for j in range(req.params.logprobs):
                    top.setdefault(int(result.top_ids[i, j]), float(result.top_logprobs[i, j]))
            out.append(SampledToken(req, token, float(result.logprobs[i]), top))
        return out

    def _sampling_tensors(self, reqs: list[Request], device: torch.device) -> SamplingTensors:
        def col(values: list[float] | list[int], dtype: torch.dtype) -> Tensor:
            return torch.tensor(values, dtype=dtype, device=device)

        ps = [r.params for r in reqs]
        t = SamplingTensors(
            temperature=col([p.temperature for p in ps], torch.float32),
            top_k=col([p.top_k if p.top_k > 0 else 0 for p in ps], torch.int64),
            top_p=col([p.top_p for p in ps], torch.float32),
            min_p=col([p.min_p for p in ps], torch.float32),
            seeds=col([r.seed for r in reqs], torch.int64),
            positions=col([r.num_tokens for r in reqs], torch.int64),
        )
        if any(p.presence_penalty or p.frequency_penalty or p.repetition_penalty != 1 for p in ps):
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
        banned = [self._banned(r) for r in reqs]
        if any(banned) or any(r.grammar is not None for r in reqs):
            allowed = torch.ones(len(reqs), self.vocab_size, dtype=torch.bool, device=device)
            for i, (req, ids) in enumerate(zip(reqs, banned, strict=True)):
                if ids:
                    allowed[i, col(sorted(ids), torch.int64)] = False
                if req.grammar is not None:
                    grammar = req.grammar.allowed().to(device)
                    # The grammar wins when it allows nothing but a banned stop token.
                    both = grammar & allowed[i]
                    allowed[i] = both if bool(both.any()) else grammar
            t.allowed = allowed
        return t

    def _banned(self, req: Request) -> set[int]:
        """Stop tokens are banned until ``min_tokens`` tokens have been generated."""
        if len(req.output_token_ids) >= req.params.min_tokens:
            return set()
        banned = set(req.params.stop_token_ids)
        if not req.params.ignore_eos:
            banned |= self.eos_token_ids
        return {t for t in banned if t < self.vocab_size}


def _logprob_entry(logp: Tensor, token: int, k: int) -> Logprobs:
    entry = {token: float(logp[token])}
    if k:
        top = torch.sort(-logp, stable=True).indices[:k]
        for t in top.tolist():
            entry.setdefault(int(t), float(logp[t]))
    return entry
