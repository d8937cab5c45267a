"""Copies that cost the host little: uploads that do not wait for the device, and many
device copies made as a few (:func:`copy_all`).

A plain copy from pageable host memory (``torch.tensor(values, device="cuda")``,
``t.to("cuda")``) synchronises the stream: the host waits until every kernel queued so far has
run. A synchronous engine waits for each step anyway, but an asynchronous one must schedule
step n+1 while step n runs, so the small index and position tensors a step uploads go through
pinned memory with a non-blocking copy, ordered on the stream like any kernel (torch's pinned
allocator keeps the buffer until the copy has been made). Restoring or resetting a state
copies hundreds of small tensors; :func:`copy_all` hands them to torch's multi-tensor copy.
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


def copy_all(dst: Sequence[Tensor], src: Sequence[Tensor]) -> None:
    """``dst[i].copy_(src[i])`` for every i, as one multi-tensor copy per dtype pair: torch's
    fused foreach copy takes tensors of one dtype at a time, and then costs a few launches on
    a GPU where a copy per tensor would cost one each (hundreds for a V4-Flash state)."""
    groups: dict[
        tuple[torch.device, torch.dtype, torch.dtype], tuple[list[Tensor], list[Tensor]]
    ] = {}
    for d, s in zip(dst, src, strict=True):
        if not d.numel():  # nothing to copy (an empty open window)
            continue
        ds, ss = groups.setdefault((d.device, d.dtype, s.dtype), ([], []))
        ds.append(d)
        ss.append(s)
    for ds, ss in groups.values():
        torch._foreach_copy_(ds, ss)
