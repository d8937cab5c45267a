"""Manifold-constrained hyper-connections (mHC) around every sublayer.

The residual is ``hc_mult`` parallel streams. Before a sublayer, weights computed from all
streams collapse them into one input (``pre``); after it, the output is spread back (``post``) and
added to a mix of the old streams (``comb``, pushed towards doubly-stochastic by Sinkhorn so the
residual cannot blow up with depth). The official checkpoint stores these as flat attributes of
the layer (``hc_attn_fn``, ``hc_ffn_base``, ...), so this module hands out named parameters
rather than being a submodule.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import Tensor, nn

from deepinfer.backends.base import Backend, Fp8Activation
from deepinfer.config import ModelConfig
from deepinfer.models.layers.norm import Linear, RMSNorm, fp32_param


def add_hc_params(module: nn.Module, prefix: str, cfg: ModelConfig, head: bool = False) -> None:
    """Register ``{prefix}_fn``, ``{prefix}_base``, ``{prefix}_scale`` on ``module``.

    A sublayer HC produces pre (n), post (n) and comb (n*n) weights with three scales; the final
    head only produces pre (n) with one scale.
    """
    n, d = cfg.hc_mult, cfg.hidden_size
    width = n if head else (2 + n) * n
    module.register_parameter(f"{prefix}_fn", fp32_param(width, n * d))
    module.register_parameter(f"{prefix}_base", fp32_param(width))
    module.register_parameter(f"{prefix}_scale", fp32_param(1 if head else 3))


@dataclass
class HyperConnection:
    """Binds one set of HC parameters of a module to the op table."""

    module: nn.Module
    prefix: str
    cfg: ModelConfig

    def _params(self) -> tuple[Tensor, Tensor, Tensor]:
        m, p = self.module, self.prefix
        return getattr(m, f"{p}_fn"), getattr(m, f"{p}_base"), getattr(m, f"{p}_scale")

    def __call__(self, ops: Backend, x: Tensor, sublayer: Callable[[Tensor], Tensor]) -> Tensor:
        fn, base, scale = self._params()
        cfg = self.cfg
        u, post, comb = ops.mhc_pre(
            x,
            fn,
            base,
            scale,
            norm_eps=cfg.rms_norm_eps,
            hc_eps=cfg.hc_eps,
            sinkhorn_iters=cfg.hc_sinkhorn_iters,
        )
        return ops.mhc_post(sublayer(u), x, post, comb)

    def normed(
        self,
        ops: Backend,
        x: Tensor,
        norm: RMSNorm,
        consumer: Linear,
        sublayer: Callable[[Tensor, Fp8Activation | None], Tensor],
    ) -> Tensor:
        """:meth:`__call__` for a sublayer whose input is ``norm``'s output, read by
        ``consumer``: the norm (and, for an FP8 ``consumer``, its quantisation) comes out of
        the entry's op, and ``sublayer`` takes the normed input and its FP8 activation."""
        fn, base, scale = self._params()
        cfg = self.cfg
        xn, xn_fp8, post, comb = ops.mhc_pre_normed(
            x,
            fn,
            base,
            scale,
            norm.weight,
            norm_eps=cfg.rms_norm_eps,
            hc_eps=cfg.hc_eps,
            sinkhorn_iters=cfg.hc_sinkhorn_iters,
            eps=norm.eps,
            fp8=consumer.scale is not None,
        )
        return ops.mhc_post(sublayer(xn, xn_fp8), x, post, comb)

    def head(self, ops: Backend, x: Tensor) -> Tensor:
        fn, base, scale = self._params()
        return ops.hc_head(
            x, fn, base, scale, norm_eps=self.cfg.rms_norm_eps, hc_eps=self.cfg.hc_eps
        )
