"""Parallelism across processes: MoE expert parallelism under attention data parallelism.

Built on ``torch.distributed`` alone (gloo on CPUs, NCCL on GPUs). This package sits below the
models: it knows process groups and tensors, never model classes, so the model layers can use it.
"""

from __future__ import annotations

from deepinfer.parallel.expert_dispatch import dispatch_experts
from deepinfer.parallel.expert_parallel import (
    ExpertParallel,
    ExpertShard,
    find_expert_parallel,
    init_expert_parallel,
)

__all__ = [
    "ExpertParallel",
    "ExpertShard",
    "dispatch_experts",
    "find_expert_parallel",
    "init_expert_parallel",
]
