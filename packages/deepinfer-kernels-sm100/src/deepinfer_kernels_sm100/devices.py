"""What the launch wrappers ask of the GPU they launch on, looked up once per device."""

from __future__ import annotations

import functools

import torch

#: SMs taken off a GPU (an H100/H200's), so the interpreter runs the launch shapes a GPU does.
DEFAULT_SMS = 132


@functools.cache
def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of ``device`` (:data:`DEFAULT_SMS` when it is no GPU)."""
    if device.type != "cuda":
        return DEFAULT_SMS
    return torch.cuda.get_device_properties(device).multi_processor_count


@functools.cache
def capability_major(device: torch.device) -> int:
    """The CUDA compute capability's major version of ``device`` (0 when it is no GPU)."""
    if device.type != "cuda":
        return 0
    return torch.cuda.get_device_capability(device)[0]
