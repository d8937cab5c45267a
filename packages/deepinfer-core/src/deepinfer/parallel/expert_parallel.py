"""Which routed experts a rank owns under MoE expert parallelism (EP), and the group it talks in.

Every rank runs attention for its own tokens (attention data parallelism) and holds one equal,
contiguous shard of each MoE layer's routed experts: rank ``r`` of ``W`` owns experts
``[r * E / W, (r + 1) * E / W)``. Contiguous shards make the owner of expert ``e`` a single
division (``e // (E / W)``) and let a rank's checkpoint tensors be picked by name alone.

World size 1 is the single-process model: no process group exists or is needed, the shard is
every expert and the MoE layer takes its ordinary path, so EP costs nothing there.
"""

from __future__ import annotations

import contextlib
import datetime
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn


@dataclass(frozen=True)
class ExpertShard:
    """The routed experts one rank owns: ``count`` of them from global id ``first``."""

    first: int
    count: int
    total: int

    @property
    def stop(self) -> int:
        return self.first + self.count

    def owns(self, expert: int) -> bool:
        return self.first <= expert < self.stop


#: Most tokens a forward may feed every rank's MoE layers for them to take the fixed-shape
#: exchange (:func:`~deepinfer.parallel.expert_dispatch.dispatch_experts`): its outputs travel
#: per (token, slot) pair from every rank, ``k * world`` times the all-to-all's, which only
#: small (decode) steps afford.
GATHER_MAX_TOKENS = 256


@dataclass
class StepTokens:
    """What the ranks agreed on for the forward under way: the most tokens any of them feeds
    its MoE layers, where that allows the fixed-shape exchange (None: the all-to-all); and
    whether this rank has agreed on the step's drafting passes yet (:meth:`ExpertParallel.
    agree_passes`)."""

    rows: int | None = None
    passes_agreed: bool = False


@dataclass(frozen=True)
class ExpertParallel:
    """This rank's place in the expert-parallel group.

    ``group`` is the ``torch.distributed`` group the MoE layers exchange tokens in; None means
    the default (world) group. ``cpu_group`` is a gloo group over the same ranks for the few
    host-side agreements a step needs when ``group`` is NCCL (None: ``group`` itself). A
    description with ``world_size > 1`` and no initialised process group still plans shapes
    and loading (what a rank reads) but cannot run a forward.
    """

    rank: int = 0
    world_size: int = 1
    group: dist.ProcessGroup | None = None
    cpu_group: dist.ProcessGroup | None = None
    #: The forward under way (:meth:`agree`); every MoE layer of the rank reads it.
    step: StepTokens = field(default_factory=StepTokens, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise ValueError(f"expert-parallel world size must be >= 1, got {self.world_size}")
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is outside a world of {self.world_size} ranks")

    @property
    def enabled(self) -> bool:
        """Whether tokens travel between ranks (world size above 1)."""
        return self.world_size > 1

    def shard(self, num_experts: int) -> ExpertShard:
        """This rank's shard of ``num_experts`` routed experts; refuses an uneven split, which
        would leave ranks with different expert counts and the owner no longer a division."""
        if num_experts % self.world_size:
            raise ValueError(
                f"{num_experts} routed experts cannot be split evenly over {self.world_size} "
                "expert-parallel ranks: the world size must divide the expert count"
            )
        count = num_experts // self.world_size
        return ExpertShard(first=self.rank * count, count=count, total=num_experts)

    def agree(self, tokens: int, rows_for: Callable[[int], int] | None = None) -> None:
        """Before a forward that feeds ``tokens`` tokens to this rank's MoE layers: learn the
        most any rank feeds (one host-side all-reduce; every rank calls this for the same
        forward) and, up to :data:`GATHER_MAX_TOKENS`, let the layers take the fixed-shape
        exchange at that many rows, which reads nothing on the host (:attr:`step`).
        ``rows_for`` rounds the most up (to a captured decode graph's batch bucket, so that
        every rank's forward runs at rows a graph was captured with)."""
        rows = self.most(tokens)
        if rows_for is not None:
            rows = rows_for(rows)
        self.step.rows = rows if rows <= GATHER_MAX_TOKENS else None

    @contextlib.contextmanager
    def forward(self, tokens: int, rows_for: Callable[[int], int] | None = None) -> Iterator[None]:
        """Around one forward through MoE layers: :meth:`agree` before it, and the agreement
        dropped after it (a later forward agrees on its own)."""
        self.agree(tokens, rows_for)
        try:
            yield
        finally:
            self.step.rows = None

    def agree_passes(self, passes: int) -> int:
        """Once a step, after its model forward: the most drafting passes through MoE layers
        (MTP: one pass of the MTP layer per draft) any rank runs this step, ``passes`` being
        this rank's. Each pass is a collective, so a rank that runs fewer makes up the rest with
        dummy passes (:mod:`deepinfer.dp.lockstep`)."""
        self.step.passes_agreed = True
        return self.most(passes)

    def most(self, value: int) -> int:
        """The largest ``value`` any rank passes (one host-side all-reduce)."""
        most = torch.tensor([value], dtype=torch.int64)
        group = self.cpu_group if self.cpu_group is not None else self.group
        dist.all_reduce(most, op=dist.ReduceOp.MAX, group=group)
        return int(most[0])

    @classmethod
    def from_torch(
        cls, group: dist.ProcessGroup | None = None, cpu_group: dist.ProcessGroup | None = None
    ) -> ExpertParallel:
        """This process's place in ``group`` (default: world), or world size 1 where no
        process group is initialised."""
        if not (dist.is_available() and dist.is_initialized()):
            return cls()
        return cls(dist.get_rank(group), dist.get_world_size(group), group, cpu_group)


def init_expert_parallel(
    device: torch.device,
    *,
    rank: int,
    world_size: int,
    init_method: str = "env://",
    timeout_s: float = 300.0,
    store: dist.Store | None = None,
) -> ExpertParallel:
    """Join the default process group (NCCL on CUDA devices, gloo elsewhere) and describe this
    rank; world size 1 creates no group at all. ``timeout_s`` bounds every collective, so a
    rank that dies or hangs fails its peers instead of blocking them forever. ``store``, when
    given, is the rendezvous in place of ``init_method`` (a caller that also uses the store
    for its own keys builds it first)."""
    if world_size == 1:
        return ExpertParallel()
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(
        backend,
        init_method=None if store is not None else init_method,
        store=store,
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
        device_id=device if device.type == "cuda" else None,
    )
    cpu_group = None
    if backend == "nccl":  # host-side agreements go through gloo, not a device sync
        cpu_group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout_s))
    return ExpertParallel.from_torch(cpu_group=cpu_group)


#: Bumped whenever a module joins an expert-parallel group (:func:`joined_expert_parallel`):
#: lookups cached on a model before that are stale.
_generation = [0]


def joined_expert_parallel() -> None:
    """Mark every cached :func:`find_expert_parallel` answer stale (a module's group changed)."""
    _generation[0] += 1


def find_expert_parallel(model: nn.Module) -> ExpertParallel | None:
    """The expert-parallel group ``model``'s MoE layers exchange tokens in, where there is one
    with more than one rank (None: every forward stays on this rank). The answer is cached on
    ``model``: a speculative step asks it every step, and walking a large model's modules
    costs the host more than the step's launch at batch 1."""
    cached = model.__dict__.get("_expert_parallel_found")
    if cached is not None and cached[0] == _generation[0]:
        return cached[1]
    found = None
    for module in model.modules():
        ep = getattr(module, "expert_parallel", None)
        if isinstance(ep, ExpertParallel) and ep.enabled:
            found = ep
            break
    model.__dict__["_expert_parallel_found"] = (_generation[0], found)
    return found
