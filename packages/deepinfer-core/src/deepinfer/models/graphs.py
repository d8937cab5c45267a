"""CUDA graphs for the token-wise half of every layer in a decode step.

A decode step on a GPU is bound by the host: a tiny-model step at batch 128 keeps the GPU busy
for about 6 ms of its 41, the rest is Python and kernel launches. The second half of each layer
(the FFN's mHC, RMSNorm, router, routed and shared experts) is a pure function of the streams
and the token ids with shapes fixed by the batch size, so it is captured once per (layer, batch
bucket) and replayed with one launch. The attention half reads and writes per-sequence state
with data-dependent shapes and stays eager.

Batches are padded up to the next bucket (1, 2, 4, then multiples of 8, vLLM's sizes): padding
rows compute on stale but finite inputs and their outputs are never read. The graphs share one
memory pool; each keeps its outputs alive, so no later capture can reuse their memory. A replay
overwrites the previous replay's outputs of the same graph, which the caller has consumed by then
(each layer's output feeds the next layer within the step).
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
        for st, t in zip(static, inputs, strict=True):
            st[: t.shape[0]].copy_(t)
        # Warm up off the capture: kernels compile, lazy probes and workspaces settle.
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
