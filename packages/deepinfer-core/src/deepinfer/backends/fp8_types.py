"""Activations handed to an FP8 projection already quantised (see :class:`Fp8Activation`)."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor


@dataclass(frozen=True)
class Fp8Activation:
    """Activations quantised as :meth:`Backend.fp8_linear` quantises its input: ``q`` [..., K]
    e4m3 and ``scale`` [..., K / 128] fp32, per token and group of 128 columns.

    The op that produces an FP8 projection's input (its RMSNorm, the shared expert's SwiGLU)
    can quantise it while the values are in registers and hand this over, so the projection
    skips its own quantisation pass: one launch and one read of the activations fewer.
    """

    q: Tensor
    scale: Tensor

    def flatten_rows(self) -> Fp8Activation:
        """[..., K] -> [N, K], as a projection's caller flattens the activations themselves."""
        return Fp8Activation(
            self.q.reshape(-1, self.q.shape[-1]), self.scale.reshape(-1, self.scale.shape[-1])
        )


#: An op's output and the same values quantised for the FP8 projection that reads them.
Fp8Output = tuple[Tensor, Fp8Activation]
