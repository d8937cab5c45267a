"""What a step holds besides the drafts it verifies, for the adaptive schedule's plan.

The plan (:func:`.verify_plan.plan`) prices a step by its tokens and draws; this reads them off
the scheduler's output, telling decoding rows from prefill chunks as the speculative step does.
"""

from __future__ import annotations

from collections.abc import Mapping

from deepinfer.engine.request import Request
from deepinfer.engine.scheduler import SchedulerOutput
from deepinfer.engine.verify_plan import StepLoad


def step_load(
    out: SchedulerOutput, drafts: Mapping[Request, list[int]]
) -> tuple[list[Request], StepLoad]:
    """The requests of ``out`` that verify drafts, and what the step holds besides them: a
    decoding row's own token (it draws one), a prefill chunk's tokens (it draws one only where
    it ends the sequence), which of those draws are made with noise, and which verifying
    request's drafts would be. Decoding rows are told apart as the speculative step does."""
    verifying: list[Request] = []
    tokens = samples = noisy = 0
    for req, n in out.scheduled.items():
        start = req.num_computed_tokens
        sampled = req.params.temperature > 0
        if is_decoding(req, n):
            tokens, samples, noisy = tokens + 1, samples + 1, noisy + sampled
            if drafts.get(req):
                verifying.append(req)
        elif start + n >= req.num_tokens:
            tokens, samples, noisy = tokens + n, samples + 1, noisy + sampled
        else:
            tokens += n
    rows = tuple(req.params.temperature > 0 for req in verifying)
    return verifying, StepLoad(tokens, samples, noisy, rows)


def is_decoding(req: Request, n: int) -> bool:
    """Whether ``req``'s ``n`` scheduled tokens are a decoding row (its last token, after its
    prompt), not a prefill chunk, as the speculative step tells them apart."""
    start = req.num_computed_tokens
    return n == 1 and start >= req.num_prompt_tokens and start + 1 == req.num_tokens
