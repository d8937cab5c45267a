"""Host time of the adaptive verify planner per engine step, by batch size.

Under ``scheduling: "adaptive"`` every decode step asks the planner whether drafting a round
pays (:func:`deepinfer.engine.verify_plan.drafting_plan`, on one row of expected survivals
per request) and every verification step trims its drafts to a plan
(:func:`deepinfer.engine.verify_plan.plan`, on each request's own confidences). Both run on
the host between GPU steps, so at a large batch their time is part of every step. This times
both at batch 1 .. 256 with k = 5 drafts a request, on a step cost shaped like a GPU's (a
plain step that grows with the batch, a verification step a little dearer, a drafting round),
the median of ``--repeats`` timings of ``--number`` calls each.

    python benchmarks/verify_planner.py [--batches 1 8 64 256]

To compare two trees, run this script with ``PYTHONPATH`` set to each tree's
``packages/deepinfer-core/src``. Results go to ``benchmarks/results/verify_planner.json``.
"""

from __future__ import annotations

import argparse
import random
import statistics
import timeit
from functools import partial
from pathlib import Path
from typing import Any

from _results import write_result

#: Expected survivals of drafts 1..5 of a round priced before its drafts exist.
EXPECTED = [0.8, 0.6, 0.45, 0.3, 0.2]


def step_cost() -> Any:
    """A step cost shaped like a GPU's: the plain step by rows, verification by tokens."""
    from deepinfer.engine.verify_cost import StepCost, VerifyCost

    plain = VerifyCost.from_table({1: 1.2e-3, 8: 1.4e-3, 64: 2.4e-3, 256: 6.5e-3})
    verify = VerifyCost.from_table({2: 1.3e-3, 64: 2.6e-3, 512: 8.0e-3, 1536: 14.0e-3})
    return StepCost.by_tokens(verify, plain)


def drafting(module: Any, *args: Any) -> list[int]:
    """What the verifier asks before a round: whether it pays and, if so, its lengths (a
    tree from before ``drafting_plan`` existed: ``drafting_budget``, then ``allocate``)."""
    if hasattr(module, "drafting_plan"):
        found = module.drafting_plan(*args)
        return [] if found is None else found.lengths
    budget = module.drafting_budget(*args)
    return [] if budget is None else module.allocate(args[0], budget)


def time_calls(fn: Any, number: int, repeats: int) -> float:
    """Median seconds of one call of ``fn`` over ``repeats`` timings of ``number`` calls."""
    return statistics.median(timeit.repeat(fn, number=number, repeat=repeats)) / number


def main() -> int:
    from deepinfer.engine import verify_plan

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64, 256])
    ap.add_argument("--number", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--label", default="current")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    cost, rng = step_cost(), random.Random(0)
    rows: dict[str, Any] = {}
    for batch in args.batches:
        seconds = partial(cost.seconds, batch)
        load = verify_plan.StepLoad(batch, batch)
        expected = [list(EXPECTED)] * batch
        confidences = [[rng.uniform(0.3, 1.0) for _ in EXPECTED] for _ in range(batch)]
        own = verify_plan.survival(confidences)
        decide = partial(drafting, verify_plan, expected, load, seconds, 1.0e-3)
        trim = partial(verify_plan.plan, own, load, seconds)
        rows[str(batch)] = {
            "drafting_us": round(time_calls(decide, args.number, args.repeats) * 1e6, 1),
            "plan_us": round(time_calls(trim, args.number, args.repeats) * 1e6, 1),
            "lengths_sum": sum(decide()),
        }
        print(batch, rows[str(batch)], flush=True)
    result = {"benchmark": "verify_planner", "label": args.label, "k": len(EXPECTED), "rows": rows}
    write_result(result, args.out, "verify_planner")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
