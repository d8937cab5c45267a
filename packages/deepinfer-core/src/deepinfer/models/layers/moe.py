"""Mixture of experts: sqrt-softplus router, routed SwiGLU experts and a shared expert.

The router's ``bias`` (auxiliary-loss-free balancing) only changes which experts win; the mixing
weights come from the unbiased scores. The first ``num_hash_layers`` layers route by a frozen
token-to-expert table (``tid2eid``) instead. Every expert clamps its SwiGLU inputs
(``swiglu_limit``): the gate from above, the up projection on both sides.

The routed experts' weights live stacked (vLLM's ``w13`` [E, 2I, d] and ``w2`` [E, d, I]) so a
backend runs all experts of a layer as one grouped matmul instead of a Python loop over experts;
the checkpoint's per-expert names map onto views of the stacks.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor, nn

from deepinfer.backends.base import Backend, Fp8Activation
from deepinfer.backends.moe_ref import add_residual
from deepinfer.config import ModelConfig
from deepinfer.models.layers.expert_count import ExpertLoad
from deepinfer.models.layers.fused import fused_group, pair
from deepinfer.models.layers.norm import Linear, fp32_param
from deepinfer.parallel import ExpertParallel, dispatch_experts


def _trains(*tensors: Tensor) -> bool:
    """Whether autograd records an op on ``tensors`` (the kernels' fused paths do not
    differentiate)."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


class Gate(nn.Module):
    def __init__(self, cfg: ModelConfig, hashed: bool) -> None:
        super().__init__()
        self.hashed = hashed
        # Router logits are computed in fp32 from a 16-bit checkpoint weight: held in fp32 once
        # at load rather than widened on every call (a copy of the weight each step and layer),
        # or in bf16 where the backend computes fp32 products from it (``hold_bf16_projections``).
        self.weight = fp32_param(cfg.n_routed_experts, cfg.hidden_size)
        if hashed:
            self.register_buffer(
                "tid2eid", torch.empty(cfg.vocab_size, cfg.num_experts_per_tok, dtype=torch.long)
            )
        else:
            self.bias = fp32_param(cfg.n_routed_experts)


class Expert(nn.Module):
    """SwiGLU MLP: ``w2(silu(w1 x) * w3 x)`` with the clamp (also the shared expert's shape)."""

    #: gate and up read the same input: one GEMM where the backend fuses them (:mod:`.fused`)
    FUSED_PAIRS = (("w1", "w3"),)

    def __init__(self, hidden: int, inter: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.w1 = Linear(hidden, inter, dtype, fp8_capable=True)
        self.w2 = Linear(inter, hidden, dtype, fp8_capable=True)
        self.w3 = Linear(hidden, inter, dtype, fp8_capable=True)

    def forward(
        self,
        ops: Backend,
        x: Tensor,
        swiglu_limit: float,
        x_fp8: Fp8Activation | None = None,
        widen: bool = True,
    ) -> Tensor:
        """fp32 output: one op for float weights held apart; else the projections, gate and
        up as one GEMM where fused, each FP8 one fed activations quantised where they were
        made (``x_fp8``: by the norm before; the down projection's: by the SwiGLU). Without
        ``widen`` the down projection's output stays in its dtype (exact in fp32, for a caller
        whose sum widens it anyway)."""
        w1, w2, w3 = self.w1, self.w2, self.w3
        floats = all(w.scale is None for w in (w1, w2, w3))
        if floats and fused_group(self, "w1", "w3") is None:
            return ops.swiglu_mlp(x, w1.weight, w2.weight, w3.weight, swiglu_limit)
        gate, up = pair(self, "w1", "w3", ops, x, x_fp8=x_fp8)
        if w2.scale is None:
            out = w2(ops, ops.swiglu(gate, up, swiglu_limit))
        else:
            out = w2(ops, *ops.swiglu_fp8(gate, up, swiglu_limit))
        return out.float() if widen else out


class RoutedExperts(nn.Module):
    """All routed experts of a layer, stacked; ``{e}.w1.weight`` etc. name views of the stacks.

    The stacks are the only owners of the memory (so ``.to()`` and ``parameters()`` see each
    byte once); the state-dict hook hands out per-expert views under the official names, in the
    order separate ``Expert`` modules would have, and the loader's ``copy_`` into a view fills
    the stack in place. Held as stored (:meth:`hold_fp4`), the stacks are packed e2m1 bytes and
    the per-expert ``.scale`` names view the ue8m0 stacks beside them.
    """

    def __init__(
        self, experts: int, hidden: int, inter: int, dtype: torch.dtype, first: int = 0
    ) -> None:
        super().__init__()
        self.inter = inter
        #: Global id of the first expert held: an expert-parallel rank holds ``experts`` of
        #: the layer's from ``first`` on, named by their global ids as the checkpoint is.
        self.first = first
        self.w13 = nn.Parameter(
            torch.empty(experts, 2 * inter, hidden, dtype=dtype), requires_grad=False
        )
        self.w2 = nn.Parameter(
            torch.empty(experts, hidden, inter, dtype=dtype), requires_grad=False
        )
        self.w13_scale: nn.Parameter | None = None
        self.w2_scale: nn.Parameter | None = None
        #: Held as FP4: no scale byte above 128, found once the values are in
        #: (:func:`~deepinfer.models.stored_formats.note_fp4_scale_range`).
        self.scales_fit = False
        self.register_state_dict_post_hook(RoutedExperts._official_names)

    def hold_fp4(self, group: int = 32) -> None:
        """Hold the experts as the checkpoint stores them: e2m1 codes two per byte, one ue8m0
        byte per ``group`` elements along each input dim (the backend's ``moe_experts_fp4``)."""
        e, rows, d = self.w13.shape
        i = self.inter
        device = self.w13.device

        def stack(*shape: int) -> nn.Parameter:
            data = torch.empty(*shape, dtype=torch.uint8, device=device)
            return nn.Parameter(data, requires_grad=False)

        self.w13, self.w13_scale = stack(e, rows, d // 2), stack(e, rows, d // group)
        self.w2, self.w2_scale = stack(e, d, i // 2), stack(e, d, i // group)

    def views(self, e: int) -> dict[str, Tensor]:
        """Held expert ``e``'s (a local index) weights (and scales) under their checkpoint
        names (views, not copies)."""
        i = self.inter
        out = {
            "w1.weight": self.w13[e, :i],
            "w2.weight": self.w2[e],
            "w3.weight": self.w13[e, i:],
        }
        if self.w13_scale is not None and self.w2_scale is not None:
            out |= {
                "w1.scale": self.w13_scale[e, :i],
                "w2.scale": self.w2_scale[e],
                "w3.scale": self.w13_scale[e, i:],
            }
        return out

    def named_views(self) -> Iterator[tuple[str, Tensor]]:
        """(``{global id}.{name}``, view) of every expert held, in expert order."""
        for e in range(self.w13.shape[0]):
            for name, view in self.views(e).items():
                yield f"{self.first + e}.{name}", view

    @staticmethod
    def _official_names(
        module: RoutedExperts, state: OrderedDict[str, Any], prefix: str, _meta: Any
    ) -> None:
        keep_vars = state.pop(prefix + "w13") is module.w13
        for name in ("w2", "w13_scale", "w2_scale"):
            state.pop(prefix + name, None)
        for name, view in module.named_views():
            state[prefix + name] = view if keep_vars else view.detach()


class MoE(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.cfg = cfg
        self.gate = Gate(cfg, cfg.is_hash_layer(layer_id))
        self.experts = RoutedExperts(
            cfg.n_routed_experts, cfg.hidden_size, cfg.moe_intermediate_size, dtype
        )
        self.shared_experts = Expert(
            cfg.hidden_size, cfg.moe_intermediate_size * cfg.n_shared_experts, dtype
        )
        #: Set by :func:`~deepinfer.models.expert_shard.shard_routed_experts`: the ranks that
        #: share this layer's routed experts (None: this process holds them all).
        self.expert_parallel: ExpertParallel | None = None
        #: Set by :class:`~deepinfer.models.expert_load.ExpertLoadTracker`: counts the pairs
        #: routed to each global expert (None: nothing counts).
        self.expert_load: ExpertLoad | None = None

    def forward(
        self, ops: Backend, x: Tensor, input_ids: Tensor, x_fp8: Fp8Activation | None = None
    ) -> Tensor:
        """The normed sublayer input ``x`` [..., d] (``x_fp8``: quantised for the shared
        expert) -> routed experts plus the shared expert, in x's dtype."""
        cfg = self.cfg
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        fixed = self.gate.tid2eid[input_ids.reshape(-1)] if self.gate.hashed else None
        weights, indices = ops.moe_route(
            flat,
            self.gate.weight,
            None if self.gate.hashed else self.gate.bias,
            topk=cfg.num_experts_per_tok,
            scoring_func=cfg.scoring_func,
            routed_scaling_factor=cfg.routed_scaling_factor,
            norm_topk_prob=cfg.norm_topk_prob,
            fixed_indices=fixed,
        )
        flat_fp8 = x_fp8.flatten_rows() if x_fp8 is not None else None
        return self.combine(ops, flat, weights, indices, flat_fp8, x.dtype).view(shape)

    def combine(  # noqa: PLR0917
        self,
        ops: Backend,
        flat: Tensor,
        weights: Tensor,
        indices: Tensor,
        flat_fp8: Fp8Activation | None,
        dtype: torch.dtype,
    ) -> Tensor:
        """Routed experts weighted by the router plus the shared expert, summed in fp32 and
        rounded to ``dtype``. Under expert parallelism the routed pairs travel to the ranks
        owning their experts and back (:func:`~deepinfer.parallel.dispatch_experts`); the
        shared expert runs here."""
        if self.expert_load is not None:
            self.expert_load.add(indices)
        ep = self.expert_parallel
        local = ep is None or not ep.enabled
        fused = self.fused_shared() if local and ops.fuses_shared_expert else None
        experts = self.experts
        if fused is not None and not _trains(flat, weights, experts.w13, experts.w2, *fused):
            return ops.moe_experts_shared(
                flat, weights, indices, w13=experts.w13, w2=experts.w2, shared_w13=fused[0],
                shared_w2=fused[1], swiglu_limit=self.cfg.swiglu_limit, out_dtype=dtype,
            )  # fmt: skip
        shared = self.shared_experts(ops, flat, self.cfg.swiglu_limit, flat_fp8, widen=False)
        if _trains(shared, flat, weights, experts.w13, experts.w2):
            # training: the rounding add (out=) does not differentiate
            return (self.routed(ops, flat, weights, indices) + shared).to(dtype)
        if not local:
            # one kernel: the shared output widened to fp32 in the add, the sum rounded on store
            return add_residual(self.routed(ops, flat, weights, indices), shared, dtype)
        # the routed experts' last kernel adds the shared output and rounds
        return self.local_experts(ops, flat, weights, indices, residual=shared, out_dtype=dtype)

    def fused_shared(self) -> tuple[Tensor, Tensor] | None:
        """The shared expert's (gate over up [2I, d], down [d, I]) where it can run as one
        more expert of the routed stacks (``Backend.moe_experts_shared``): gate and up fused
        into one weight (:mod:`.fused`), every weight float, shaped and typed as a routed
        expert's; else None."""
        shared, experts = self.shared_experts, self.experts
        w13 = fused_group(shared, "w1", "w3")
        if w13 is None or experts.w13_scale is not None:
            return None
        if w13.scale is not None or shared.w2.scale is not None:
            return None
        pairs = ((w13.weight, experts.w13), (shared.w2.weight, experts.w2))
        if any(w.dtype != stack.dtype or w.shape != stack.shape[1:] for w, stack in pairs):
            return None
        return w13.weight, shared.w2.weight

    def routed(self, ops: Backend, flat: Tensor, weights: Tensor, indices: Tensor) -> Tensor:
        """The routed experts' fp32 weighted sum [N, d]: the held ones, or under expert
        parallelism the pairs sent to the ranks owning their experts and back."""
        ep = self.expert_parallel
        if ep is None or not ep.enabled:
            return self.local_experts(ops, flat, weights, indices)
        shard = ep.shard(self.cfg.n_routed_experts)
        local = functools.partial(self.local_experts, ops)
        return dispatch_experts(
            ep, shard, flat, weights=weights, indices=indices, local_experts=local
        )

    def local_experts(
        self,
        ops: Backend,
        flat: Tensor,
        weights: Tensor,
        indices: Tensor,
        *,
        residual: Tensor | None = None,
        out_dtype: torch.dtype = torch.float32,
    ) -> Tensor:
        """The held routed experts on ``flat`` [N, d], ``indices`` [N, k] local to the stacks;
        the fp32 weighted sum [N, d] (plus ``residual``, in ``out_dtype``: the backend op's)."""
        experts = self.experts
        tail = {"swiglu_limit": self.cfg.swiglu_limit, "residual": residual, "out_dtype": out_dtype}
        if experts.w13_scale is not None and experts.w2_scale is not None:
            return ops.moe_experts_fp4(
                flat, weights, indices, w13=experts.w13, w13_scale=experts.w13_scale,
                w2=experts.w2, w2_scale=experts.w2_scale, scales_fit=experts.scales_fit, **tail,
            )  # fmt: skip
        return ops.moe_experts(flat, weights, indices, w13=experts.w13, w2=experts.w2, **tail)
