"""Host-to-device copies that do not make the host wait for the device.

A plain copy from pageable host memory (``torch.tensor(values, device="cuda")``,
``t.to("cuda")``) synchronises the stream: the host waits until every kernel queued so far has
run. A synchronous engine waits for each step anyway, but an asynchronous one must schedule
step n+1 while step n runs, so the small index and position tensors a step uploads go through
pinned memory with a non-blocking copy, ordered on the stream like any kernel (torch's pinned
allocator keeps the buffer until the copy has been made).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def to_device(t: Tensor, device: torch.device) -> Tensor:
    """``t`` on ``device``, copied without waiting for the device's queued work."""
    if t.device.type != "cpu" or device.type == "cpu":
        return t.to(device)
    if device.type == "cuda":
        t = t.pin_memory()
    return t.to(device, non_blocking=True)


def rows_to_device(rows: Sequence[Tensor], device: torch.device) -> list[Tensor]:
    """Equal-length 1-D host tensors of one dtype on ``device`` through one copy, as the rows
    of one block: a step's sampling columns, each of which would be a copy of its own (and its
    own pinned buffer, whose allocation costs the host more than the copy)."""
    if not rows:
        return []
    return list(to_device(torch.stack(list(rows)), device).unbind(0))
