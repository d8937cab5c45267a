"""The rank processes and their process group: started, joined, served, ended.

Rank 0 is the caller's process: it runs the front end (:mod:`.frontend`) and its own engine.
On one node it starts ranks ``1..D-1`` with ``torch.multiprocessing`` (spawn), and every rank
joins the default process group through a file store in a temporary directory. Started by
``torchrun`` (``RANK``/``WORLD_SIZE`` in the environment) nothing is spawned: every process
joins through ``env://``, rank 0 returns the front end, and every other rank's ``LLM(...)``
serves steps until rank 0 ends the run, then exits the process.

Each rank keeps the rendezvous store for the start-up's own keys (:mod:`.startup`): waits on
it are polled, so a process that ends during start-up is seen at once, never after the
timeout. The group's timeout bounds every collective, so a rank that dies or hangs is found
within it; the front end also checks its spawned workers' exit codes before every step.
"""

from __future__ import annotations

import datetime
import logging
import multiprocessing
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from deepinfer.dp.lockstep import RankStepper
from deepinfer.dp.options import DataParallelOptions
from deepinfer.dp.protocol import StepCommand, StepReply
from deepinfer.engine.engine import LLMEngine
from deepinfer.errors import DeepInferError
from deepinfer.parallel import ExpertParallel, init_expert_parallel

logger = logging.getLogger(__name__)

#: Seconds a worker gets to leave after the stop command before it is killed.
STOP_GRACE_S = 10.0
#: Seconds between two looks at the start-up store.
POLL_S = 0.05
#: The start-up store's key a rank sets just before it joins the process group.
JOINING_KEY = "deepinfer/joining/{}"
#: The value of a start-up key that reports success.
OK = "ok"


class DataParallelError(DeepInferError):
    """A rank died, hung past the timeout or failed: the data-parallel run is over (or never
    started)."""


@dataclass(frozen=True)
class RankPlace:
    """Where a spawned worker stands, set before it builds its ``LLM``."""

    rank: int
    world_size: int
    init_method: str


#: This process's place when it is a spawned worker (empty in the caller's process).
_SPAWNED: list[RankPlace] = []


@dataclass
class RankGroup:
    """This process's rank, its expert-parallel description and (rank 0 on one node) the
    worker processes it started."""

    options: DataParallelOptions
    rank: int
    local_rank: int
    ep: ExpertParallel
    workers: mp.ProcessContext | None = None
    store_dir: tempfile.TemporaryDirectory[str] | None = None
    torchrun: bool = False
    #: The rendezvous store, kept for the start-up's keys (set when the rank joins).
    store: dist.Store | None = None
    closed: bool = field(default=False)

    @property
    def expert_parallel(self) -> ExpertParallel | None:
        """What the model loads its routed experts by: this rank's shard, or every expert
        (None) without ``enable_expert_parallel`` (each rank then holds them all)."""
        return self.ep if self.options.enable_expert_parallel else None

    def device(self, device: str) -> str:
        """This rank's device: ``cuda`` (any index) becomes ``cuda:<local rank>``."""
        return f"cuda:{self.local_rank}" if device.startswith("cuda") else device

    def dead_worker(self, wait_s: float = 0.0) -> str | None:
        """A line naming a spawned worker that has exited (waiting up to ``wait_s`` for one
        to, as a peer's broken connection may be seen before its exit), or None."""
        if self.workers is None:
            return None
        deadline = time.monotonic() + wait_s
        for i, process in enumerate(self.workers.processes):
            process.join(max(0.0, deadline - time.monotonic()))
            if process.exitcode is not None:
                return f"data-parallel rank {i + 1} exited with code {process.exitcode}"
        return None

    def lost_peer(self) -> str | None:
        """A line naming the process this one can no longer start with, or None: for rank 0 a
        spawned worker that exited, for a spawned worker rank 0 (its parent). Under torchrun
        the launcher ends every process once one fails, so nothing is watched here."""
        if self.workers is not None:
            return self.dead_worker()
        parent = multiprocessing.parent_process()
        if _SPAWNED and parent is not None and not parent.is_alive():
            return "data-parallel rank 0 exited"
        return None

    def wait_keys(
        self, keys: dict[int, str], settled: Callable[[dict[int, str]], bool] | None = None
    ) -> dict[int, str]:
        """The values of the start-up store's ``keys`` (rank -> key) once every one is set,
        or once ``settled`` says the ones set so far decide the matter.

        The store is looked at, not waited on, between checks of the peer processes, so a
        peer that has ended is seen at once. The ranks start together, so one that has set
        nothing ``dp_startup_timeout_s`` after this rank began to wait counts as hung. Either
        raises :class:`DataParallelError`."""
        assert self.store is not None, "the rank has not joined yet"
        timeout = self.options.startup_timeout_s
        own = self.options.dp_startup_timeout_s is not None
        name = "dp_startup_timeout_s" if own else "dp_timeout_s"
        deadline = time.monotonic() + timeout
        while True:
            lost = self.lost_peer()  # before the look: what a peer set before it ended counts
            seen = {r: self.store.get(k).decode() for r, k in keys.items() if self.store.check([k])}
            if len(seen) == len(keys) or (settled is not None and settled(seen)):
                return seen
            if lost is not None:
                raise DataParallelError(f"{lost} during start-up")
            if time.monotonic() > deadline:
                missing = ", ".join(str(r) for r in keys if r not in seen)
                raise DataParallelError(
                    f"data-parallel rank {missing} still starting after {name}={timeout}s"
                )
            time.sleep(POLL_S)

    def close(self, graceful: bool) -> None:
        """End the run: stop the workers (by the stop command when ``graceful``, else kill
        them), leave the process group and remove the store. Safe to call twice."""
        if self.closed:
            return
        self.closed = True
        if graceful:
            try:
                send_commands([StepCommand(stop=True)] * self.options.data_parallel_size)
            except Exception as exc:  # a rank is gone already: the kill below ends the rest
                logger.warning("data-parallel stop command failed: %r", exc)
        if self.workers is not None:
            for process in self.workers.processes:
                process.join(STOP_GRACE_S if graceful else 0)
                if process.is_alive():
                    process.kill()
                process.join()
        if dist.is_initialized():
            dist.destroy_process_group()
        if self.store_dir is not None:
            self.store_dir.cleanup()


def send_commands(commands: list[StepCommand]) -> StepCommand:
    """Rank 0: scatter one command to each rank; returns rank 0's own."""
    box: list[Any] = [None]
    dist.scatter_object_list(box, list(commands), src=0)
    return box[0]


def gather_replies(reply: StepReply) -> list[StepReply]:
    """Rank 0: its reply and every other rank's, in rank order."""
    out: list[Any] = [None] * dist.get_world_size()
    dist.gather_object(reply, out, dst=0)
    return out


def torchrun_place() -> tuple[int, int, int] | None:
    """(rank, world size, local rank) when ``torchrun`` started this process."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return None
    env = os.environ
    return int(env["RANK"]), int(env["WORLD_SIZE"]), int(env.get("LOCAL_RANK", env["RANK"]))


def threads_per_rank(options: DataParallelOptions, num_threads: int | None) -> int | None:
    """The CPU threads of each rank of a run spawned on one node: ``num_threads`` when given,
    else this process's count shared among the ranks, which all compute at once on the same
    cores (each with every core's thread would oversubscribe them many times over). Under
    ``torchrun`` each process's own count stands: torchrun sets ``OMP_NUM_THREADS`` per
    process."""
    if num_threads is not None or not options.enabled or torchrun_place() is not None:
        return num_threads
    return max(1, torch.get_num_threads() // options.data_parallel_size)


def start_ranks(
    options: DataParallelOptions, device: str, llm_args: dict[str, Any]
) -> RankGroup | None:
    """Join (and on one node, as rank 0, start) the ranks of a data-parallel run.

    ``device`` is the device the caller asked for; ``llm_args`` the ``LLM`` arguments every
    spawned worker builds its own ``LLM`` from. None for one rank: no process, no group."""
    if not options.enabled:
        return None
    size = options.data_parallel_size
    cuda = device.startswith("cuda")
    if _SPAWNED:
        place = _SPAWNED[0]
        return join(RankGroup(options, place.rank, place.rank, ExpertParallel()), place, cuda)
    launched = torchrun_place()
    if launched is not None:
        rank, world, local = launched
        if world != size:
            raise DeepInferError(
                f"data_parallel_size={size} but torchrun started {world} processes"
            )
        group = RankGroup(options, rank, local, ExpertParallel(), torchrun=True)
        return join(group, RankPlace(rank, world, "env://"), cuda)
    if cuda and torch.cuda.device_count() < size:
        raise DeepInferError(
            f"data_parallel_size={size} needs {size} GPUs on this node, found "
            f"{torch.cuda.device_count()} (several nodes: start every rank with torchrun)"
        )
    store_dir = tempfile.TemporaryDirectory(prefix="deepinfer-dp-")
    init = f"file://{store_dir.name}/store"
    workers = mp.start_processes(
        worker_main,
        args=(size, init, llm_args),
        nprocs=size - 1,
        join=False,
        daemon=True,
        start_method="spawn",
    )
    group = RankGroup(options, 0, 0, ExpertParallel(), workers, store_dir)
    try:
        return join(group, RankPlace(0, size, init), cuda)
    except BaseException:
        group.close(graceful=False)
        raise


def join(group: RankGroup, place: RankPlace, cuda: bool) -> RankGroup:
    """Join the process group through the rendezvous of ``place.init_method``, whose store
    the rank keeps for the start-up. Every rank says so in the store first, and rank 0 waits
    for all of them before it joins: a worker that ended on its way here is then seen at once
    (the join itself would wait for it until the timeout)."""
    if cuda:
        dev = torch.device(f"cuda:{group.local_rank}")
        torch.cuda.set_device(dev)
    else:
        dev = torch.device("cpu")
    timeout = group.options.dp_timeout_s
    span = datetime.timedelta(seconds=group.options.startup_timeout_s)
    found = dist.rendezvous(place.init_method, place.rank, place.world_size, timeout=span)
    store, _, _ = next(found)
    store.set_timeout(span)
    group.store = store
    store.set(JOINING_KEY.format(group.rank), OK)
    if group.rank == 0:
        group.wait_keys({r: JOINING_KEY.format(r) for r in range(1, place.world_size)})
    group.ep = init_expert_parallel(
        dev,
        rank=place.rank,
        world_size=place.world_size,
        timeout_s=timeout,
        store=dist.PrefixStore("default_pg", store),
    )
    return group


def worker_main(index: int, world_size: int, init_method: str, llm_args: dict[str, Any]) -> None:
    """A spawned worker (rank ``index + 1``): build the same ``LLM`` as rank 0, which joins
    the group and serves steps until the stop command (see :func:`serve`)."""
    _SPAWNED.append(RankPlace(index + 1, world_size, init_method))
    from deepinfer.llm import LLM  # the LLM module imports this package

    LLM(**llm_args)


def serve(engine: LLMEngine, group: RankGroup) -> None:
    """A rank above 0: run the commands rank 0 scatters, one step each, until told to stop.
    A failure (the step's, or a collective's: rank 0 is gone or timed out) ends the process
    with an error, which its peers' collectives then report."""
    stepper = RankStepper(engine, group.rank)
    while True:
        box: list[Any] = [None]
        dist.scatter_object_list(box, None, src=0)
        command: StepCommand = box[0]
        if command.stop:
            break
        dist.gather_object(stepper.run(command), None, dst=0)
    dist.destroy_process_group()  # only after a clean stop: a broken group is left to exit
