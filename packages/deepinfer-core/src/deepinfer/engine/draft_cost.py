"""The drafter's time per round against the requests it drafts, for the verify planner.

A round of speculation is a drafting pass and a verifying step, so whether to draft a round
at all (:func:`.verify_plan.drafting_pays`) divides the tokens the round is expected to emit by
both times, as vLLM does with its draft-cost table by request count. Like the step cost
(:mod:`.verify_cost`), the curve is measured, not modelled: dummy drafting rounds of the
speculator itself (``dummy_draft``: made-up requests with a context each, as many as the point
says) at a ladder of counts, each the fastest of a few runs (other work on the machine only
adds time), forced non-decreasing with a running max, and looked up the same way. A table can
be given instead (``"draft_cost": {requests: seconds}``).
"""

from __future__ import annotations

import time
from typing import Protocol, runtime_checkable

import torch

from deepinfer.engine.verify_cost import VerifyCost, profile_points
from deepinfer.engine.verify_profile import PROFILE_REPEATS

#: Most requests a profiled round drafts; past it the last slope is extrapolated.
PROFILE_MAX_REQUESTS = 256
PROFILE_MAX_REQUESTS_CPU = 64


@runtime_checkable
class ProfiledDrafter(Protocol):
    """A drafter that can run a made-up round of ``num_requests`` requests, to be timed."""

    def dummy_draft(self, num_requests: int) -> None: ...


@torch.no_grad()
def profile_draft_cost(
    drafter: ProfiledDrafter,
    max_num_seqs: int,
    device: torch.device,
    repeats: int = PROFILE_REPEATS,
) -> VerifyCost:
    """Seconds of a drafting round of ``drafter`` against its requests (as a
    :class:`.verify_cost.VerifyCost`, requests in place of tokens), at each of
    :func:`.verify_cost.profile_points` up to ``max_num_seqs`` (capped, see the constants);
    the runs of a point are taken in separate passes over all points, and the fastest kept."""
    cap = PROFILE_MAX_REQUESTS_CPU if device.type == "cpu" else PROFILE_MAX_REQUESTS
    points = profile_points(max(1, min(max_num_seqs, cap)))
    runs: dict[int, list[float]] = {n: [] for n in points}
    drafter.dummy_draft(points[-1])  # warm-up: allocations, caches
    for _ in range(repeats):  # whole passes: a burst of load spoils one run per point
        for n in points:
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            begin = time.perf_counter()
            drafter.dummy_draft(n)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            runs[n].append(time.perf_counter() - begin)
    return VerifyCost.from_table({n: min(r) for n, r in runs.items()})
