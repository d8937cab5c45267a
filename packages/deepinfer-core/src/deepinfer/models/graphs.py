"""CUDA graphs for decode steps.

A decode step on a GPU is bound by the host: a tiny-model step at batch 128 keeps the GPU busy
for a few ms of its 40-80, the rest is Python and kernel launches. Two kinds of function are
captured, once per batch bucket, and replayed with one launch:

* a whole step, when every state of the batch lives in the shared slot tensors (V4): the step
  is then a fixed sequence of device ops over those tensors (``DeepseekV4ForCausalLM``);
* otherwise each layer's FFN half (mHC, RMSNorm, router, routed and shared experts), a pure
  function of the streams and token ids; attention, whose per-row state handling has
  data-dependent shapes, stays eager.

Batches are padded up to the next bucket (1, 2, 4, then multiples of 8, vLLM's sizes) with
all-zero rows, whose outputs are never read (a whole captured step sends their state writes to
the slot tensors' padding row 0). The graphs share one memory pool; each keeps its outputs
alive, so no later capture can reuse their memory. A replay overwrites the previous replay's
outputs of the same graph, which the caller has consumed by then.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass

import torch
from torch import Tensor

GraphFn = Callable[..., tuple[Tensor, ...]]


def decode_buckets(max_batch: int) -> list[int]:
    """Batch sizes that get a graph: 1, 2, 4, then every multiple of 8 up to ``max_batch``."""
    sizes = [n for n in (1, 2, 4) if n < max_batch] + list(range(8, max_batch + 8, 8))
    return [n for n in sizes if n < max_batch] + [max_batch]


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
        self._pool: tuple[int, int] | None = None
        self._captured: dict[tuple[Hashable, int], _Captured] = {}

    @property
    def num_captured(self) -> int:
        return len(self._captured)

    def run(self, key: Hashable, fn: GraphFn, *inputs: Tensor) -> tuple[Tensor, ...]:
        """``fn(*inputs)`` through the graph of ``key`` for this batch's bucket (captured on
        first use). Every input has the batch as its first dim; so does every output."""
        b = inputs[0].shape[0]
        bucket = next((n for n in self.buckets if n >= b), None)
        if bucket is None or inputs[0].device.type != "cuda":
            return fn(*inputs)
        entry = self._captured.get((key, bucket))
        if entry is None:
            entry = self._capture(key, bucket, fn, inputs)
        for static, t in zip(entry.inputs, inputs, strict=True):
            static[:b].copy_(t)
            static[b:].zero_()  # padding rows: zeros (slot 0 is the slot tensors' padding row)
        entry.graph.replay()
        return tuple(out[:b] for out in entry.outputs)

    def _capture(
        self, key: Hashable, bucket: int, fn: GraphFn, inputs: tuple[Tensor, ...]
    ) -> _Captured:
        static = tuple(t.new_zeros((bucket, *t.shape[1:])) for t in inputs)
        # Warm up off the capture (kernels compile, lazy probes and workspaces settle) on
        # all-padding inputs: a step that writes state then writes only the padding row, never
        # a sequence's (running a real step more than once would advance it twice).
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                fn(*static)
        torch.cuda.current_stream().wait_stream(side)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            outputs = fn(*static)
        entry = _Captured(graph, static, tuple(outputs))
        self._captured[key, bucket] = entry
        return entry
