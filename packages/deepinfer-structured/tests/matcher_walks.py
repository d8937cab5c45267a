"""Walks through a grammar matcher, shared by the tests and
``benchmarks/structured_schema_battery.py``.

:func:`random_walk` samples outputs uniformly over what the matcher allows (the outputs are
then checked by an independent validator); :func:`rollback_walk` moves a matcher back and
forth along a token sequence and compares it, at every stop, with a fresh matcher that replays
the same prefix: rollback must leave no trace.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import torch

from deepinfer.sampling_params import StructuredOutputsParams


def random_walk(matcher: Any, stop: int, rng: random.Random, *, steps: int) -> list[int] | None:
    """Token ids of one uniform random walk over the matcher's allowed tokens to the grammar's
    end (None if cut at ``steps``); the stop token, when allowed, ends it half the time."""
    ids: list[int] = []
    for _ in range(steps):
        allowed = matcher.allowed().nonzero()[:, 0].tolist()
        token = stop if stop in allowed and rng.random() < 0.5 else rng.choice(allowed)
        assert matcher.accept(token)
        if token == stop:
            return ids
        ids.append(token)
    return None


def rollback_walk(
    backend: Any,
    constraint: StructuredOutputsParams,
    matcher: Any,
    tokens: list[int],
    *,
    check: Callable[[Any, torch.Tensor], None] | None = None,
    moves: int = 12,
) -> int:
    """From the end of ``tokens`` (all accepted by ``matcher``), ``moves`` random rollbacks,
    each followed by a random stretch forward again; after each rollback the matcher must allow
    exactly what ``backend.matcher(constraint)`` allows after replaying the same prefix, and
    ``check(matcher, allowed)`` may test more there. Returns the final position."""
    rng = random.Random(0)
    position = len(tokens)
    for _ in range(moves):
        back = rng.randint(0, position)
        matcher.rollback(back)
        position -= back
        replay = backend.matcher(constraint)
        for t in tokens[:position]:
            assert replay.accept(t)
        allowed = matcher.allowed()
        assert torch.equal(allowed, replay.allowed()), position
        if check is not None:
            check(matcher, allowed)
        forward = rng.randint(0, len(tokens) - position)
        for t in tokens[position : position + forward]:
            assert matcher.accept(t)
        position += forward
    return position
