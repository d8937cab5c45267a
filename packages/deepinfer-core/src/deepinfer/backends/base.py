"""The Backend interface: the op table the model and the sampler call.

Every op is an abstract public method, so the table is the interface: the torch reference
(:class:`deepinfer.backends.torch_ref.TorchBackend`) implements all of them, and hardware
packages subclass it and override only public ops they accelerate, so every op always has the
reference to fall back on and to be tested against.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import TYPE_CHECKING, ClassVar

import torch
from torch import Tensor

from deepinfer.backends.fp8_types import Fp8Activation, Fp8Output
from deepinfer.backends.token_ops import TokenOps
from deepinfer.errors import BackendUnavailableError
from deepinfer.plugins import Availability

if TYPE_CHECKING:
    from collections.abc import Sequence

    from deepinfer.backends.compress_ref import WindowBuffers
    from deepinfer.backends.compress_verify_ref import VerifyPlan
    from deepinfer.paging import KeyPages, PagedEntries

__all__ = ["Availability", "Backend", "Fp8Activation", "Fp8Output"]


class Backend(TokenOps):
    """Base of every backend: availability check and the device it runs on.

    ``availability()`` is a classmethod so that discovery and ``deepinfer info`` can ask without
    building a backend (and without touching the device more than the check needs).
    """

    name: ClassVar[str] = "base"
    #: torch device types this backend runs on.
    device_types: ClassVar[tuple[str, ...]] = ()

    @classmethod
    @abstractmethod
    def availability(cls) -> Availability:
        """Whether this backend can run on this machine, and why not."""

    @classmethod
    def default_device(cls) -> torch.device:
        return torch.device(cls.device_types[0])

    def __init__(self, device: str | torch.device | None = None) -> None:
        avail = type(self).availability()
        if not avail.ok:
            raise BackendUnavailableError(f"backend '{self.name}' cannot run here: {avail.reason}")
        self.device = torch.device(device) if device is not None else type(self).default_device()
        if self.device.type not in self.device_types:
            raise BackendUnavailableError(
                f"backend '{self.name}' runs on {', '.join(self.device_types)}, "
                f"not on device '{self.device}'"
            )

    def __repr__(self) -> str:
        return f"{type(self).__name__}(device={str(self.device)!r})"

    def supports_cuda_graphs(self, dtype: torch.dtype) -> bool:
        """Whether the token-wise ops (mHC, norms, router, experts) run in ``dtype`` without a
        host sync or data-dependent shapes, so a whole decode step can be captured.

        Not the torch reference: its experts loop on the host without a grouped matmul, and
        torch's grouped matmul (2.11) copies from the host while it runs."""
        return False

    #: The stored weight formats this backend computes on with kernels, so a model under
    #: ``quantization="auto"`` keeps them as stored (otherwise it dequantises them at load):
    #: ``"fp8"`` (:meth:`fp8_linear`), ``"fp4_experts"`` (:meth:`moe_experts_fp4`) and
    #: ``"bf16_projections"`` (:meth:`linear_fp32` on bf16 weights: the head, router gate and
    #: compressor projections, stored bf16 and computed in fp32). The torch reference's
    #: versions of those ops are the numeric reference, not fast paths.
    native_formats: ClassVar[frozenset[str]] = frozenset()
    #: Whether a loaded model runs projections of one input as one GEMM (attention's ``wq_a``
    #: and ``wkv``: :mod:`deepinfer.models.layers.fused`): fewer launches, and one activation
    #: quantisation for FP8 weights, but summation orders of the fused GEMM's own, which the
    #: numeric reference does not take.
    fuse_projections: ClassVar[bool] = False
    #: Whether an MoE layer whose shared expert is held as its routed experts are (float, one
    #: expert's width) runs it through :meth:`moe_experts_shared`: one more expert of the
    #: routed kernels rather than GEMMs of its own (fewer launches, its output summed in
    #: fp32 unrounded, which the numeric reference does not do).
    fuses_shared_expert: ClassVar[bool] = False

    # -- the op table ------------------------------------------------------------------------
    # Every op the model calls. Shapes use B batch, S new tokens, H heads, D head dim, d hidden,
    # n mHC streams, E experts, k routed experts per token. A kernel backend overrides a subset;
    # the torch reference implements all of them.

    @abstractmethod
    def linear(self, x: Tensor, weight: Tensor) -> Tensor:
        """``x @ weight.T`` in the weight's dtype (FP8/FP4 backends dequantise or run natively)."""

    @abstractmethod
    def linear_fp32(self, x: Tensor, weight: Tensor) -> Tensor:
        """``x @ weight.T`` as the reference computes the head, router gate and compressor
        projections: ``x`` and ``weight`` widened to fp32, an fp32 result. ``weight`` is held
        in fp32 or, where its values are exact there (a checkpoint stores these in bf16), in
        bf16; a kernel backend may then use bf16 tensor cores as long as the result stays
        within a small factor of the error bound of an fp32 GEMM in any summation order (the
        sm100 backend: within it for a bf16 input, within twice it for an fp32 input of width
        253 or more, which it splits into two bf16 parts)."""

    @abstractmethod
    def fp8_linear(
        self,
        x: Tensor,
        weight: Tensor,
        scale: Tensor,
        block: tuple[int, int],
        x_fp8: Fp8Activation | None = None,
    ) -> Tensor:
        """``x @ w.T`` for an FP8 e4m3 ``weight`` [N, K] with one fp32 ``scale`` per ``block``
        (rows, cols) of it, as DeepGEMM computes it: ``x`` [..., K] quantised to e4m3 per token
        and 128 columns (scale amax / 448, round to nearest even), products of the quantised
        values summed in fp32 and scaled per (activation group, weight block). Returns
        [..., N] in ``x``'s dtype. ``x_fp8``: ``x`` already quantised so (by
        :meth:`rms_norm_fp8` or :meth:`swiglu_fp8`), used in place of quantising it again."""

    @abstractmethod
    def fp8_grouped_linear(
        self, x: Tensor, weight: Tensor, scale: Tensor, block: tuple[int, int]
    ) -> Tensor:
        """:meth:`grouped_linear` on an FP8 ``weight`` [g*o, i] with its block ``scale``: group
        j's output is :meth:`fp8_linear` of ``x[..., j, :]`` with rows ``j*o .. (j+1)*o``."""

    @abstractmethod
    def swiglu(self, gate: Tensor, up: Tensor, swiglu_limit: float) -> Tensor:
        """``silu(min(gate, l)) * clamp(up, -l, l)`` computed in fp32 (no clamp when ``l`` <= 0),
        returned in ``gate``'s dtype: the shared expert's activation between FP8 projections."""

    @abstractmethod
    def swiglu_fp8(self, gate: Tensor, up: Tensor, swiglu_limit: float) -> Fp8Output:
        """:meth:`swiglu`, and its output quantised as :meth:`fp8_linear` quantises its input
        (the shared expert's down projection reads it). ``gate`` and ``up`` may be row slices
        of one wider tensor (a fused gate/up projection's halves)."""

    @abstractmethod
    def grouped_linear(self, x: Tensor, weight: Tensor) -> Tensor:
        """Block-diagonal projection: ``x`` [..., g, i], ``weight`` [g*o, i] -> [..., g, o]."""

    @abstractmethod
    def rms_norm(self, x: Tensor, weight: Tensor | None, eps: float) -> Tensor:
        """RMSNorm over the last dim, fp32 statistics; ``weight=None`` is the unweighted form."""

    @abstractmethod
    def rms_norm_fp8(self, x: Tensor, weight: Tensor, eps: float) -> Fp8Output:
        """:meth:`rms_norm`, and its output (in ``x``'s dtype) quantised as :meth:`fp8_linear`
        quantises its input: for the FP8 projections that read a norm's output."""

    def mhc_pre_normed(
        self,
        x: Tensor,
        fn: Tensor,
        base: Tensor,
        scale: Tensor,
        weight: Tensor,
        *,
        norm_eps: float,
        hc_eps: float,
        sinkhorn_iters: int,
        eps: float,
        fp8: bool,
    ) -> tuple[Tensor, Fp8Activation | None, Tensor, Tensor]:
        """:meth:`mhc_pre`, then the sublayer's RMSNorm (``weight``, ``eps``) of the collapsed
        input, with ``fp8`` also quantised as :meth:`rms_norm_fp8` quantises: (normed input,
        its FP8 activation or None, post, comb). One op, so that a backend can norm the row
        in the kernel that collapses it; here: the two ops."""
        u, post, comb = self.mhc_pre(
            x, fn, base, scale, norm_eps=norm_eps, hc_eps=hc_eps, sinkhorn_iters=sinkhorn_iters
        )
        if not fp8:
            return self.rms_norm(u, weight, eps), None, post, comb
        normed, act = self.rms_norm_fp8(u, weight, eps)
        return normed, act, post, comb

    @abstractmethod
    def rope(self, x: Tensor, cos: Tensor, sin: Tensor, inverse: bool = False) -> Tensor:
        """Interleaved RoPE on the trailing ``2*cos.shape[-1]`` channels of ``x`` [B, S, H, D].

        ``cos``/``sin`` are [S, r/2] (one angle per channel pair), or [B, S, r/2] when the rows
        of a batch sit at different positions. ``inverse`` rotates by the negative angle, which
        attention uses to de-rotate its output at the query position.
        """

    def rms_norm_rope(
        self, x: Tensor, weight: Tensor | None, eps: float, cos: Tensor, sin: Tensor
    ) -> Tensor:
        """:meth:`rms_norm` over each head of ``x`` [B, S, H, D], then :meth:`rope`: queries,
        kv rows and compressed entries, one op so that a backend can fuse the two."""
        return self.rope(self.rms_norm(x, weight, eps), cos, sin)

    def rms_norm_rope_into(  # noqa: PLR0917
        self,
        x: Tensor,
        weight: Tensor | None,
        eps: float,
        cos: Tensor,
        sin: Tensor,
        pool: Tensor,
        rows: Tensor,
    ) -> None:
        """:meth:`rms_norm_rope` of one row a batch entry (``x`` [B, 1, 1, D]) stored at rows
        ``rows`` [B] of ``pool`` [R, D] (a decode step's new kv rows and entries, into their
        rings' and pages' flattened rows) instead of returned: one op, so a backend
        can store the values where they go; here the op and an indexed write."""
        out = self.rms_norm_rope(x, weight, eps, cos, sin).reshape(rows.shape[0], -1)
        pool[rows] = out.to(pool.dtype)

    @abstractmethod
    def attention(self, q: Tensor, kv: Tensor, mask: Tensor, sinks: Tensor, scale: float) -> Tensor:
        """Shared-KV MQA with one sink logit per head.

        ``q`` [B, S, H, D], ``kv`` [B, L, D] (keys and values alike), ``mask`` [B, S, L] bool
        (True = visible), ``sinks`` [H] fp32. Returns [B, S, H, D]. The sink joins the softmax
        denominator only.
        """

    def paged_attention(
        self,
        q: Tensor,
        sources: Sequence[KeyPages],
        sinks: Tensor,
        scale: float,
        derotate: tuple[Tensor, Tensor] | None = None,
    ) -> Tensor:
        """:meth:`attention` of decode rows (``q`` [B, 1, H, D]) over the listed entries of one
        or two :class:`~deepinfer.paging.KeyPages` (a row's ring, its entries' pages) in order,
        in the first pool's dtype; with ``derotate`` (cos, sin [B, 1, r/2]) its output then
        rotated back there (:meth:`rope`, inverse). One op, so a backend can read the keys in
        place and rotate where it writes (here: keys copied, then the two ops)."""
        from deepinfer.backends.attention_ref import gathered_attention

        out = gathered_attention(self.attention, q, sources, sinks, scale)
        return out if derotate is None else self.rope(out, *derotate, inverse=True)

    @abstractmethod
    def sparse_attention(
        self, q: Tensor, kv: Tensor, index: Tensor, sinks: Tensor, scale: float
    ) -> Tensor:
        """:meth:`attention` where each query lists the keys it sees instead of masking all.

        ``index`` [B, S, K] int64: rows of ``kv`` [B, L, D] (distinct within a query; -1 =
        none). A prefill query sees ``sliding_window`` rows plus its top-k entries, a few
        hundred keys out of the whole chunk's, so the work follows K instead of L. Equal to
        ``attention`` with ``mask[b, s, l] = l in index[b, s]``.
        """

    @abstractmethod
    def sampling_uniform(
        self, seeds: Tensor, positions: Tensor, width: int, stream: int = 0
    ) -> Tensor:
        """The sampler's noise source: ``[rows, width]`` float32 uniforms in (0, 1) of the
        counter RNG keyed by each row's ``seeds`` and ``positions`` (int64, [rows]); must equal
        :func:`deepinfer.sampling.rng.sampling_uniform` bit for bit, so a seeded request draws
        the same tokens on every backend."""

    @abstractmethod
    def compress(
        self,
        kv: Tensor,
        score: Tensor,
        prev_kv: Tensor | None,
        prev_score: Tensor | None,
        overlap: bool,
        *,
        dtype: torch.dtype = torch.float32,
    ) -> Tensor:
        """Softmax-pool complete windows into compressed entries (before norm and RoPE).

        ``kv``/``score`` [B, n, r, c*D] fp32 with the position bias already in ``score``. With
        ``overlap`` (c = 2) entry w pools the first half of window w-1 and the second half of
        window w; ``prev_kv``/``prev_score`` [B, r, D] supply window -1 (None: no such window).
        Returns [B, n, D] pooled in fp32 and rounded to ``dtype`` (the entries' storage type:
        a kernel stores them so, with no cast of its own)."""

    def compress_slots(  # noqa: PLR0917
        self,
        kv: Tensor,
        score: Tensor,
        bias: Tensor | None,
        buffers: WindowBuffers,
        slots: Tensor,
        phase: Tensor,
        history_row: Tensor | None,
        overlap: bool,
        dtype: torch.dtype = torch.float32,
    ) -> Tensor:
        """A decode step's compressor windows over shared buffers, one new token a row.

        Row i's projections ``kv``/``score`` [B, c*D] fp32, with ``bias[phase[i]]`` (the
        position bias [ratio, c*D], None: none) added to ``score``, go to row ``phase[i]`` of
        slot ``slots[i]``'s open window and, with a history ring, to its row
        ``history_row[i]``; where the window completes (``phase[i] == ratio - 1``) it is
        pooled as :meth:`compress` pools it (overlap: with the stored previous half) and its
        first half replaces the stored one. Returns [B, 1, D], the fp32 pooling rounded once
        to ``dtype`` (the entries'), zeros in the rows whose window is still open: their entry
        is provisional, seen by no query before the step that completes the window (so a
        backend need not read an open window). One op, so a backend can do all of it in one
        kernel; here: torch ops around :meth:`compress`."""
        from deepinfer.backends.compress_ref import pool_slot_windows

        rows = (kv, score, bias, buffers, slots, phase, history_row)
        return pool_slot_windows(self.compress, *rows, overlap=overlap).to(dtype)

    def verify_plan(
        self, positions: Tensor, slots: Tensor, lengths: Tensor, ratio: int
    ) -> VerifyPlan:
        """Where a verification pass's rows (tokens at ``positions`` [B, T] writing ``slots``,
        the first ``lengths`` [B] real) stand in the windows of ``ratio``: one op a pass and
        ratio, which a kernel backend makes in one launch (here: the reference's index ops)."""
        from deepinfer.backends.compress_verify_ref import plan_windows

        return plan_windows(positions, slots, lengths, ratio)

    def compress_verify(  # noqa: PLR0917
        self,
        kv: Tensor,
        score: Tensor,
        bias: Tensor | None,
        buffers: WindowBuffers,
        slots: Tensor,
        plan: VerifyPlan,
        overlap: bool,
        dtype: torch.dtype = torch.float32,
    ) -> Tensor:
        """A verification pass's compressor windows over shared buffers, up to T new tokens a
        row (:mod:`deepinfer.backends.compress_verify_ref`).

        Row i's projections ``kv``/``score`` [B, T, c*D] fp32, with ``bias[phase]`` (None:
        none) added to ``score``, go to the history ring (where the buffers keep one) and, for
        the row's last ``ratio`` real tokens, to slot ``slots[i]``'s open window; each of the
        row's candidate windows (``plan``) is pooled as :meth:`compress` pools it (overlap:
        window -1 is the stored previous half), and the first half of the row's last closing
        window replaces the stored one. Returns [B, W, D], the fp32 pooling rounded once to
        ``dtype``; rows of windows that do not close are provisional (written where no query
        reads them), so a backend may leave them zero and need not read those windows. One op,
        so a backend can do all of it in one kernel; here: torch ops around :meth:`compress`."""
        from deepinfer.backends.compress_verify_ref import pool_verify_windows

        rows = (kv, score, bias, buffers, slots, plan)
        return pool_verify_windows(self.compress, *rows, overlap=overlap).to(dtype)

    @abstractmethod
    def indexer_topk(  # noqa: PLR0917
        self,
        q: Tensor,
        keys: Tensor | PagedEntries,
        weights: Tensor,
        n_visible: Tensor,
        topk: int,
        weight_scale: float = 1.0,
    ) -> Tensor:
        """Lightning-indexer selection: ``sum_h weights * relu(q . k)`` then top-k.

        ``q`` [B, S, h, c], ``keys`` [B, T, c] (decode rows: in their pages), ``weights``
        [B, S, h] in any float dtype, widened to fp32 and multiplied by ``weight_scale``
        there (as one fp32 multiply: a backend may do it where it reads them),
        ``n_visible`` [S] (or [B, S] for rows at different positions) = entries each query
        may see. Returns [B, S, min(topk, T)] int64 with -1 where a pick falls outside the
        visible entries.
        """

    @abstractmethod
    def topk_picks(
        self,
        scores: Tensor,
        k: int,
        *,
        n_visible: Tensor | None = None,
        allowed: Tensor | None = None,
    ) -> Tensor:
        """The ``k`` (<= T) highest entries of each row of ``scores`` [..., T] fp32, highest
        first, equal scores to the lower entry id (a stable descending sort's first k, so picks
        never depend on how many unseen entries follow). Entries a row may not see, past
        ``n_visible`` [...] or where ``allowed`` [..., T] is False, count as -inf and come back
        as -1. Returns [..., k] int64."""

    @abstractmethod
    def indexer_scores(
        self, q: Tensor, keys: Tensor | PagedEntries, weights: Tensor, weight_scale: float = 1.0
    ) -> Tensor:
        """Raw indexer scores ``sum_h w * relu(q . k)``: ``q`` [B, S, h, c], ``keys``
        [B, T, c] (decode rows: in their pages), ``w`` = ``weights`` [B, S, h] in fp32 times
        ``weight_scale`` (as in :meth:`indexer_topk`) -> [B, S, T] fp32, nothing masked
        (V4.1 masks and picks in the model because of its candidate blocks)."""
