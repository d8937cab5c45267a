"""CUDA graphs for decode steps.

A decode step on a GPU is bound by the host: its kernels are many and small, so Python and
kernel launches take longer than the GPU's work. So the whole step is captured, once per batch
bucket, and replayed with one launch: every state of the batch lives in the shared
slot tensors (V4 and V4.1, Engram history included), and the step is then a fixed sequence of
device ops over those tensors (``deepinfer.models.decode``). It reads the entry pages up to a
bucket of the batch's longest sequence (1, 4, 16, ... pages, :func:`entry_buckets`), so there is
one graph per batch bucket and entry bucket, and a step reads at most 4x the pages it needs.

Batches are padded up to the next bucket (1, 2, 4, then multiples of 8, vLLM's sizes) with
all-zero rows, whose outputs are never read (a whole captured step sends their state writes to
the slot tensors' padding row 0). A graph is captured on first use; the engine captures every
bucket's whole step at startup, as vLLM does, so no run pays for it.

Under expert parallelism every MoE layer is a collective whose shapes a graph bakes in, so
every rank's step runs in the bucket of the rows the ranks agreed on for it
(:attr:`DecodeGraphs.expert_parallel`'s ``step.rows``; eagerly when they agreed on the
all-to-all), and graphs are captured by every rank together: at startup, in the same order; a
capture on first use would run its warm-up forwards on one rank alone
(:attr:`DecodeGraphs.capture_on_use` off). A decode step whose graph is missing then runs
eagerly and is remembered (``run(..., defer=True)``), and between steps
:meth:`DecodeGraphs.capture_wanted` has the ranks capture what any of them wants, one bucket
at a time, the largest first: a rank with a wanted graph of the agreed bucket captures it, the
others run as many dummy forwards at those rows as a capture runs warm-ups, so the
collectives pair up (the capture itself records them without running them).

Memory: the graphs share one memory pool for their intermediates, and their static inputs and
outputs live in buffers of ``max_batch`` rows shared by every graph whose i-th input (output)
has the same row shape and dtype; a graph uses the first ``bucket`` rows. Without that each
graph would hold its own. The cost is the rule every caller already follows: a replay's outputs
are consumed before the next replay (of any graph) overwrites them.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass

import torch
from torch import Tensor

from deepinfer.parallel.expert_parallel import ExpertParallel

GraphFn = Callable[..., tuple[Tensor, ...]]

#: Eager runs of a step before its capture (kernels compile, lazy probes and workspaces
#: settle); under expert parallelism the ranks not capturing run as many dummy forwards. One
#: settles them: the graph tests stay exact with it, and each capture costs a third less
#: (``benchmarks/host_time.py --capture-warmups``).
CAPTURE_WARMUPS = 1


def entry_buckets(pages_per_slot: int) -> list[int]:
    """Entry pages a captured step reads: powers of 4 up to a slot's capacity."""
    sizes, n = [], 1
    while n < pages_per_slot:
        sizes.append(n)
        n *= 4
    return [*sizes, pages_per_slot]


def entry_bucket(pages: int, pages_per_slot: int) -> int:
    """The smallest entry bucket of at least ``pages`` pages."""
    return next(b for b in entry_buckets(pages_per_slot) if b >= pages)


def decode_buckets(max_batch: int) -> list[int]:
    """Batch sizes that get a graph: 1, 2, 4, then every multiple of 8 up to ``max_batch``."""
    sizes = [n for n in (1, 2, 4) if n < max_batch] + list(range(8, max_batch + 8, 8))
    return [n for n in sizes if n < max_batch] + [max_batch]


def round_to_bucket(n: int, buckets: list[int]) -> int:
    """The smallest of ``buckets`` holding ``n`` rows, or ``n`` itself past the largest."""
    return next((b for b in buckets if b >= n), n)


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]


class DecodeGraphs:
    def __init__(self, max_batch: int) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.buckets = decode_buckets(max_batch)
        self.max_batch = max_batch
        self._pool: tuple[int, int] | None = None
        self._captured: dict[tuple[Hashable, int], _Captured] = {}
        self._shared: dict[tuple[str, int, tuple[int, ...], torch.dtype, torch.device], Tensor] = {}
        #: The group whose agreed rows pick each step's bucket (None: its own batch does).
        self.expert_parallel: ExpertParallel | None = None
        #: Whether a bucket without a graph captures one (off under expert parallelism, once
        #: the startup captures are done: it then runs eagerly, and is captured later by
        #: :meth:`capture_wanted` if the step asked to ``defer`` it).
        self.capture_on_use = True
        self._wanted: dict[tuple[Hashable, int], tuple[GraphFn, tuple[Tensor, ...]]] = {}
        #: Tokens every verification row is padded to (None: its states' slack + 1). A
        #: speculative engine sets k + 1, its longest row, and so does its start-up profile,
        #: whose states keep more slack: the profiled passes must have the engine's shapes,
        #: since a library GEMM may pick a kernel several times slower for one row more.
        self.verify_width: int | None = None

    @property
    def num_captured(self) -> int:
        return len(self._captured)

    def run(
        self, key: Hashable, fn: GraphFn, *inputs: Tensor, defer: bool = False
    ) -> tuple[Tensor, ...]:
        """``fn(*inputs)`` through the graph of ``key`` for this batch's bucket (captured on
        first use). Every input has the batch as its first dim; so does every output.
        ``defer``: under expert parallelism, a missing graph is captured later, with the other
        ranks (:meth:`capture_wanted`); ``fn`` must then be a whole forward through the model's
        MoE layers, as the dummy forwards the other ranks pair it with are."""
        b = rows = inputs[0].shape[0]
        ep = self.expert_parallel
        if ep is not None:
            if ep.step.rows is None:  # the ranks take the all-to-all, which no graph holds
                return fn(*inputs)
            rows = max(b, ep.step.rows)
        bucket = next((n for n in self.buckets if n >= rows), None)
        if bucket is None or inputs[0].device.type != "cuda":
            return fn(*inputs)
        entry = self._captured.get((key, bucket))
        if entry is None:
            if not self.capture_on_use:
                if defer and ep is not None:
                    self._wanted.setdefault((key, bucket), (fn, inputs))
                return fn(*inputs)
            entry = self._capture(key, bucket, fn, inputs)
        for static, t in zip(entry.inputs, inputs, strict=True):
            static[:b].copy_(t)
            static[b:].zero_()  # padding rows: zeros (slot 0 is the slot tensors' padding row)
        entry.graph.replay()
        return tuple(out[:b] for out in entry.outputs)

    def capture_wanted(self, dummy_forward: Callable[[], object]) -> int:
        """Under expert parallelism, called by every rank at the same point between steps:
        capture the graphs any rank's steps wanted (see the module). Per round the ranks agree
        on the largest wanted bucket (a host-side all-reduce; 0 ends it); each rank with a
        wanted graph of that bucket captures one, the others call ``dummy_forward`` (a forward
        through the model's MoE layers, at the rows set here) :data:`CAPTURE_WARMUPS` times.
        Returns how many graphs this rank captured."""
        ep = self.expert_parallel
        if ep is None:
            return 0
        captured = 0
        while bucket := ep.most(max((b for _, b in self._wanted), default=0)):
            mine = next((item for item in self._wanted if item[1] == bucket), None)
            ep.step.rows = bucket
            try:
                if mine is None:
                    for _ in range(CAPTURE_WARMUPS):
                        dummy_forward()
                else:
                    fn, inputs = self._wanted.pop(mine)
                    self._capture(mine[0], bucket, fn, inputs)
                    captured += 1
            finally:
                ep.step.rows = None
        return captured

    def _buffer(self, kind: str, index: int, like: Tensor, bucket: int) -> Tensor:
        """The first ``bucket`` rows of the shared buffer for ``like``'s row shape and dtype."""
        k = (kind, index, tuple(like.shape[1:]), like.dtype, like.device)
        buf = self._shared.get(k)
        if buf is None:
            buf = self._shared[k] = like.new_zeros((self.max_batch, *like.shape[1:]))
        return buf[:bucket]

    def _capture(
        self, key: Hashable, bucket: int, fn: GraphFn, inputs: tuple[Tensor, ...]
    ) -> _Captured:
        static = tuple(self._buffer("in", i, t, bucket) for i, t in enumerate(inputs))
        for t in static:
            t.zero_()
        # Warm up off the capture (kernels compile, lazy probes and workspaces settle) on
        # all-padding inputs: a step that writes state then writes only the padding row, never
        # a sequence's (running a real step more than once would advance it twice).
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(CAPTURE_WARMUPS):
                warm = fn(*static)
        torch.cuda.current_stream().wait_stream(side)
        outputs = tuple(self._buffer("out", i, t, bucket) for i, t in enumerate(warm))
        del warm
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            for out, t in zip(outputs, fn(*static), strict=True):
                out.copy_(t)  # the graph's own result is freed: later captures reuse it
        entry = _Captured(graph, static, outputs)
        self._captured[key, bucket] = entry
        return entry
