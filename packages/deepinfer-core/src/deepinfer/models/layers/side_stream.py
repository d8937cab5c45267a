"""A second CUDA stream for a branch of a layer that can run beside the main stream's work.

At decode sizes most of a layer's kernels are too small to fill the GPU, so two independent
chains of them finish sooner side by side than one after the other. The MoE's shared expert
(two GEMMs and a SwiGLU) needs only the layer input, not the router's picks, so it runs on the
side stream while the routed experts run on the main one (SGLang and vLLM overlap it the same
way). The kernels and their operands are the same either way, so the bits are too.

The branch forks from the current stream (the side stream waits for everything queued so far)
and is joined before its result is read (the current stream waits for the side stream). A CUDA
graph captures both: the fork pulls the side stream into the capture and the join brings it
back before the capture ends. The caching allocator keeps the branch's allocations on the side
stream; each later fork waits for the main stream first, so a block the main stream freed after
reading it cannot be reused while it is still being read.

Only where the backend asks for it (``Backend.overlap_shared_experts``), on a CUDA device, for at
most :data:`MAX_ROWS` rows: a prefill chunk's GEMMs fill the GPU alone.
"""

from __future__ import annotations

from types import TracebackType

import torch

from deepinfer.backends.base import Backend

#: Rows (tokens) up to which a branch runs beside the main stream; decode and verification
#: steps have at most a few hundred.
MAX_ROWS = 1024

_streams: dict[int, torch.cuda.Stream] = {}


class SideStream:
    """``with side: ...`` queues the block's work on the side stream, after everything the
    current stream has queued; :meth:`join` makes the current stream wait for it."""

    def __init__(self, device: torch.device) -> None:
        index = device.index if device.index is not None else torch.cuda.current_device()
        stream = _streams.get(index)
        if stream is None:
            stream = _streams[index] = torch.cuda.Stream(device=index)
        self.stream = stream
        self._context: torch.cuda.StreamContext | None = None

    def __enter__(self) -> SideStream:
        self.stream.wait_stream(torch.cuda.current_stream(self.stream.device))
        self._context = torch.cuda.stream(self.stream)
        self._context.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._context is not None
        self._context.__exit__(exc_type, exc, tb)
        self._context = None

    def join(self) -> None:
        """The current stream waits for the work queued on the side stream so far."""
        torch.cuda.current_stream(self.stream.device).wait_stream(self.stream)


def side_stream(ops: Backend, rows: int, device: torch.device) -> SideStream | None:
    """The side stream for a branch over ``rows`` rows on ``device``, or None where the branch
    runs in line: a backend that does not overlap, a device that is not CUDA, or more rows
    than :data:`MAX_ROWS`."""
    if not ops.overlap_shared_experts or device.type != "cuda" or rows > MAX_ROWS:
        return None
    return SideStream(device)
