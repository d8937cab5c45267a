"""The start-up of a data-parallel run: every rank builds its engine, and every rank learns
whether all of them did before the first step.

A rank whose build fails (a checkpoint it cannot read, memory, an interrupt) must not leave
the others to find out in the first step's collectives, after the timeout, nor leave processes
behind. So each rank sets its outcome in the start-up store (:meth:`.group.RankGroup.wait_keys`
polls it while watching the peer processes), rank 0 reads them and sets the verdict, and every
rank acts on it. On success rank 0 returns the front end and the others serve. On a failure
every rank leaves the group, rank 0 kills the workers it spawned and raises: its own error when
its own build failed (what one process raises), else a :class:`~.group.DataParallelError`
naming each rank that failed and why. Rank 0 does not wait for the others' builds once its own
has failed. A failed worker waits for the verdict before it raises, so that under ``torchrun``,
which ends every process once one fails, rank 0 has given its answer first.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from deepinfer.dp.frontend import DataParallelEngine, front_end
from deepinfer.dp.group import OK, DataParallelError, RankGroup
from deepinfer.engine.engine import LLMEngine

logger = logging.getLogger(__name__)

#: The start-up store's key of a rank's outcome: ``OK`` or its error.
BUILT_KEY = "deepinfer/built/{}"
#: The start-up store's key of rank 0's verdict: ``OK`` or the failures.
VERDICT_KEY = "deepinfer/verdict"


def start_engine(group: RankGroup, build: Callable[[], LLMEngine]) -> DataParallelEngine:
    """Build this rank's engine with ``build`` and settle the start-up with the other ranks.

    Rank 0 gets the front end over every rank's engine; any other rank serves steps until
    rank 0 ends the run, then its process exits (never returns). Raises on every rank when any
    rank failed, after the rank has left the group (see the module's docstring)."""
    try:
        engine = build()
    except BaseException as exc:
        if group.rank > 0:
            logger.error("data-parallel rank %d failed to start", group.rank, exc_info=exc)
        settle_failure(group, exc)
        raise
    try:
        verdict = settle(group)
        if verdict != OK:
            raise DataParallelError(
                f"data-parallel start-up failed: {verdict}; every rank was stopped"
            )
    except BaseException:  # a failure elsewhere, a peer gone, or Ctrl-C while waiting
        group.close(graceful=False)
        raise
    return front_end(engine, group)


def describe(rank: int, outcome: str) -> str:
    """One rank's failure as the verdict names it."""
    return f"rank {rank} ({outcome})"


def settle(group: RankGroup) -> str:
    """This rank built its engine: say so and return the verdict. Rank 0 reads every rank's
    outcome (until the first failure: the rest need not finish) and sets the verdict."""
    store = group.store
    assert store is not None
    store.set(BUILT_KEY.format(group.rank), OK)
    if group.rank > 0:
        return group.wait_keys({0: VERDICT_KEY})[0]
    keys = {r: BUILT_KEY.format(r) for r in range(1, group.options.data_parallel_size)}
    try:
        seen = group.wait_keys(keys, settled=lambda got: any(v != OK for v in got.values()))
        failed = [describe(r, outcome) for r, outcome in sorted(seen.items()) if outcome != OK]
    except DataParallelError as exc:  # a worker ended, or hung, before it told its outcome
        failed = [str(exc)]
    verdict = ", ".join(failed) or OK
    store.set(VERDICT_KEY, verdict)
    return verdict


def settle_failure(group: RankGroup, error: BaseException) -> None:
    """This rank's build failed: say so, set (rank 0) or wait for (the others) the verdict,
    and leave the group. The caller raises ``error`` afterwards."""
    store = group.store
    assert store is not None
    outcome = f"{type(error).__name__}: {error}"
    try:
        store.set(BUILT_KEY.format(group.rank), outcome)
        if group.rank == 0:
            store.set(VERDICT_KEY, describe(0, outcome))
        else:
            group.wait_keys({0: VERDICT_KEY})
    except Exception as exc:  # rank 0 or its store is gone: nobody is left to tell
        logger.warning("data-parallel rank %d could not report its failure: %r", group.rank, exc)
    finally:
        group.close(graceful=False)
