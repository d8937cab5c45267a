"""Parameter holders for RMSNorm and plain projections.

They own only weights, named as in the official checkpoint (``weight``), and call the backend op
table, so a kernel backend swaps the maths without the module tree changing. Weights are created
uninitialised: they are always filled from a checkpoint, and initialising hundreds of billions of
parameters first would waste minutes.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from deepinfer.backends.base import Backend, Fp8Activation


class RMSNorm(nn.Module):
    """Weighted RMSNorm; the weight stays fp32 as in the reference, statistics are fp32."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(dim, dtype=torch.float32), requires_grad=False)

    def forward(self, ops: Backend, x: Tensor) -> Tensor:
        return ops.rms_norm(x, self.weight, self.eps)

    def rotated(self, ops: Backend, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        """Rows ``x`` [B, S, D] normed, then RoPE at their positions (``cos``/``sin``
        [..., S, r/2]): one op (:meth:`~deepinfer.backends.base.Backend.rms_norm_rope`)."""
        return ops.rms_norm_rope(x[:, :, None], self.weight, self.eps, cos, sin)[:, :, 0]

    def rotated_into(  # noqa: PLR0917
        self, ops: Backend, x: Tensor, cos: Tensor, sin: Tensor, pool: Tensor, rows: Tensor
    ) -> None:
        """:meth:`rotated` of rows ``x`` [B, S, D] (``cos``/``sin`` [B, S, r/2]), each stored
        at its row of ``pool`` [R, D] (``rows`` [B, S] or, with S = 1, [B]): a decode step's
        rows, or a verification pass's tokens or candidate windows, as one op over B * S rows
        (:meth:`~deepinfer.backends.base.Backend.rms_norm_rope_into`)."""
        n = rows.numel()
        x, cos, sin = x.reshape(n, 1, 1, -1), cos.reshape(n, 1, -1), sin.reshape(n, 1, -1)
        ops.rms_norm_rope_into(x, self.weight, self.eps, cos, sin, pool, rows.reshape(n))

    def feeding(
        self, ops: Backend, x: Tensor, consumer: Linear
    ) -> tuple[Tensor, Fp8Activation | None]:
        """The normed ``x``, and, where ``consumer`` (the projection that reads it) holds its
        weight in FP8, the normed values quantised as it would quantise them: one launch
        (:meth:`~deepinfer.backends.base.Backend.rms_norm_fp8`) in place of two."""
        if consumer.scale is None:
            return self(ops, x), None
        return ops.rms_norm_fp8(x, self.weight, self.eps)


class Linear(nn.Module):
    """Bias-free projection ``y = x @ weight.T``.

    ``fp8_capable``: the model calls it only through :meth:`forward`, so it may hold its
    weight as stored, FP8 e4m3 with fp32 block scales (:meth:`hold_fp8`, under
    ``quantization="auto"``); projections whose weight other ops read directly stay in their
    float dtype.

    ``computes_fp32`` (the head, the compressors' projections): it computes in fp32 whatever
    its input (:meth:`~deepinfer.backends.base.Backend.linear_fp32`), also once the weight is
    held in bf16 (:func:`~deepinfer.models.stored_formats.hold_bf16_projections`).
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        dtype: torch.dtype,
        fp8_capable: bool = False,
        groups: int = 1,
        *,
        computes_fp32: bool = False,
    ) -> None:
        super().__init__()
        self.weight = nn.Parameter(
            torch.empty(out_features, in_features, dtype=dtype), requires_grad=False
        )
        self.fp8_capable = fp8_capable
        self.computes_fp32 = computes_fp32
        #: > 1: a block-diagonal projection, called through :meth:`grouped` only.
        self.groups = groups
        self.scale: nn.Parameter | None = None  # the official ``<name>.scale`` when FP8
        self.block = (0, 0)

    def hold_fp8(self, block: tuple[int, int]) -> None:
        """Hold the weight in FP8 e4m3 with one fp32 scale per ``block`` (rows, cols), as the
        checkpoint stores it (ue8m0 scales are powers of two: exact in fp32)."""
        n, k = self.weight.shape
        device = self.weight.device
        self.weight = nn.Parameter(
            torch.empty(n, k, dtype=torch.float8_e4m3fn, device=device), requires_grad=False
        )
        grid = (-(-n // block[0]), -(-k // block[1]))
        self.scale = nn.Parameter(
            torch.empty(grid, dtype=torch.float32, device=device), requires_grad=False
        )
        self.block = block

    def forward(self, ops: Backend, x: Tensor, x_fp8: Fp8Activation | None = None) -> Tensor:
        """``x @ weight.T``; ``x_fp8``: ``x`` quantised already (for an FP8 weight)."""
        if self.scale is not None:
            return ops.fp8_linear(x, self.weight, self.scale, self.block, x_fp8)
        if self.computes_fp32:
            return ops.linear_fp32(x, self.weight)
        return ops.linear(x, self.weight)

    def grouped(self, ops: Backend, x: Tensor) -> Tensor:
        """Group j of ``x`` [..., groups, in / groups] through rows j of the weight."""
        if self.scale is not None:
            return ops.fp8_grouped_linear(x, self.weight, self.scale, self.block)
        return ops.grouped_linear(x, self.weight)


class Embedding(nn.Module):
    """Token embedding table (``embed.weight``).

    Held as stored (:meth:`hold_fp8_rows`, V4.1's Engram tables), the rows are e4m3 bytes with
    one ue8m0 byte per ``group`` values, and a lookup decodes only the rows it reads.
    """

    def __init__(self, vocab_size: int, dim: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab_size, dim, dtype=dtype), requires_grad=False)
        self.dtype = dtype
        self.scale: nn.Parameter | None = None  # the official ``<name>.scale`` when FP8
        self.group = 0

    def hold_fp8_rows(self, group: int) -> None:
        rows, dim = self.weight.shape
        device = self.weight.device
        self.weight = nn.Parameter(
            torch.empty(rows, dim, dtype=torch.uint8, device=device), requires_grad=False
        )
        groups = -(-dim // group)  # the last group of a row may be short
        self.scale = nn.Parameter(
            torch.empty(rows, groups, dtype=torch.uint8, device=device), requires_grad=False
        )
        self.group = group

    def forward(self, ids: Tensor) -> Tensor:
        if self.scale is None:
            return self.weight[ids]
        values = self.weight[ids].view(torch.float8_e4m3fn).float()
        factor = torch.exp2(self.scale[ids].float() - 127.0)
        factor = factor.repeat_interleave(self.group, dim=-1)[..., : values.shape[-1]]
        return (values * factor).to(self.dtype)


def fp32_param(*shape: int) -> nn.Parameter:
    """An uninitialised fp32 parameter (mHC, sinks, position biases are fp32 in the checkpoint)."""
    return nn.Parameter(torch.empty(*shape, dtype=torch.float32), requires_grad=False)
