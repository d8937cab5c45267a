"""Token sampling: counter-keyed Gumbel-max with deterministic filters."""

from __future__ import annotations

from deepinfer.sampling.sampler import SamplerOutput, SamplingTensors, filter_mask, sample

__all__ = ["SamplerOutput", "SamplingTensors", "filter_mask", "sample"]
