"""The sampler's counter RNG as one kernel.

``deepinfer.sampling.rng`` hashes each row's (seed, position) into a key and each (key, token)
into 23 uniform bits with ``triple32``, in int64 tensor ops that emulate 32-bit wrapping: about
140 launches per sampling step, a millisecond of host time in a step that is otherwise a
graph replay. Here each program derives its row's key and hashes a block of tokens in uint64
registers (every product of two 32-bit values fits), so the bits are the reference's exactly.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

_M32 = 0xFFFFFFFF


@triton.jit
def _hash32(x):
    """``triple32`` on uint64 values below 2**32 (rng.hash32)."""
    x = x & 0xFFFFFFFF
    x = x ^ (x >> 17)
    x = (x * 0xED5AD4BB) & 0xFFFFFFFF
    x = x ^ (x >> 11)
    x = (x * 0xAC4C1B51) & 0xFFFFFFFF
    x = x ^ (x >> 15)
    x = (x * 0x31848BAB) & 0xFFFFFFFF
    return x ^ (x >> 14)


@triton.jit(do_not_specialize=["stream"])  # a stream of 0 or 1 must stay a runtime value
def _uniform_kernel(  # noqa: PLR0917 (Triton kernels take positional arguments)
    seed_ptr,
    pos_ptr,
    out_ptr,
    width,
    stream,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    seed = tl.load(seed_ptr + row).to(tl.uint64)  # seeds are in [0, 2**63)
    pos = tl.load(pos_ptr + row).to(tl.uint64)
    key = _hash32(seed & 0xFFFFFFFF) ^ _hash32((seed >> 32) ^ 0x9E3779B9)
    key = _hash32(key ^ (pos & 0xFFFFFFFF))
    key = _hash32(key ^ stream.to(tl.uint64))
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    col_key = _hash32((cols.to(tl.uint64) * 0x9E3779B1) & 0xFFFFFFFF)
    bits = _hash32(key ^ col_key)
    u = ((bits >> 9).to(tl.float32) + 0.5) * (1.0 / 8388608.0)
    tl.store(out_ptr + row * width + cols, u, mask=cols < width)


def sampling_uniform(seeds: Tensor, positions: Tensor, width: int, stream: int = 0) -> Tensor:
    """``[rows, width]`` float32 uniforms, equal bit for bit to
    :func:`deepinfer.sampling.rng.sampling_uniform`."""
    rows = seeds.shape[0]
    out = torch.empty(rows, width, dtype=torch.float32, device=seeds.device)
    if rows == 0 or width == 0:
        return out
    block = 1024
    _uniform_kernel[(rows, triton.cdiv(width, block))](
        seeds.to(torch.int64).contiguous(),
        positions.to(torch.int64).contiguous(),
        out,
        width,
        stream & _M32,
        BLOCK=block,
    )
    return out
