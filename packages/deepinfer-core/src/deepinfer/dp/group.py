"""The rank processes and their process group: started, joined, served, ended.

Rank 0 is the caller's process: it runs the front end (:mod:`.frontend`) and its own engine.
On one node it starts ranks ``1..D-1`` with ``torch.multiprocessing`` (spawn), and every rank
joins the default process group through a file store in a temporary directory. Started by
``torchrun`` (``RANK``/``WORLD_SIZE`` in the environment) nothing is spawned: every process
joins through ``env://``, rank 0 returns the front end, and every other rank's ``LLM(...)``
serves steps until rank 0 ends the run, then exits the process.

The group's timeout bounds every collective, so a rank that dies or hangs is found within it;
the front end also checks its spawned workers' exit codes before every step.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
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


def start_ranks(
    options: DataParallelOptions, device: str, llm_args: dict[str, Any]
) -> RankGroup | None:
    """Join (and on one node, as rank 0, start) the ranks of a data-parallel run.

    ``device`` is the device the caller asked for; ``llm_args`` the ``LLM`` arguments every
    spawned worker builds its own ``LLM`` from. None for one rank: no process, no group."""
    if not options.enabled:
        return None
    size, timeout = options.data_parallel_size, options.dp_timeout_s
    dev = torch.device("cuda" if device.startswith("cuda") else "cpu")

    def join(rank: int, local: int, init: str) -> ExpertParallel:
        if dev.type == "cuda":
            dev_here = torch.device(f"cuda:{local}")
            torch.cuda.set_device(dev_here)
        else:
            dev_here = dev
        return init_expert_parallel(
            dev_here, rank=rank, world_size=size, init_method=init, timeout_s=timeout
        )

    if _SPAWNED:
        place = _SPAWNED[0]
        ep = join(place.rank, place.rank, place.init_method)
        return RankGroup(options, place.rank, place.rank, ep)
    launched = torchrun_place()
    if launched is not None:
        rank, world, local = launched
        if world != size:
            raise DeepInferError(
                f"data_parallel_size={size} but torchrun started {world} processes"
            )
        return RankGroup(options, rank, local, join(rank, local, "env://"), torchrun=True)
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
        group.ep = join(0, 0, init)
    except BaseException:
        group.close(graceful=False)
        raise
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
