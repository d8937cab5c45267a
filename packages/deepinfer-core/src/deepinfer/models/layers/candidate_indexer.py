"""V4.1 shared indexer: index keys on KV sources, top-k picks on index sources, candidate blocks.

V4.1 splits V4's lightning indexer across layers:

* a KV-source layer projects index keys from its compressor's un-rotated latents
  (``wk`` then ``k_norm``, then RoPE at the entry position);
* an index-source layer scores its queries (``wq_b`` on the shared query latent, per-head
  ``weights_proj``) against the keys of its group's KV source and publishes the top-k entry ids;
  every other compressed layer reuses the latest index source's picks;
* the candidate source additionally publishes, per query, the ``candidate_topk_blocks`` blocks of
  ``candidate_block_size`` consecutive entries with the highest maximum score; later index sources
  score only inside those blocks (a two-level selection that bounds their work).

Selection ranks like a stable descending sort, so equal scores always resolve to the lower
entry id and the picks do not depend on how many future (masked) entries a chunk happens to
hold.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from deepinfer.backends.base import Backend
from deepinfer.config import ModelConfig
from deepinfer.models.layers.norm import Linear, RMSNorm
from deepinfer.models.layers.rope import Rotary
from deepinfer.models.layers.visibility import listed
from deepinfer.models.memo import StepMemo
from deepinfer.paging import KeyPages, PagedEntries


@dataclass
class SharedKV:
    """What source layers hand to the layers after them within one forward call."""

    # KV source -> [B, T, D] rotated entries and [B, T, c] index keys (decode rows: paged)
    entries: dict[int, Tensor | PagedEntries] = field(default_factory=dict)
    keys: dict[int, Tensor | PagedEntries] = field(default_factory=dict)
    picks: dict[int, Tensor] = field(default_factory=dict)  # index source -> [B, S, k], -1 = none
    #: [B, S, T] entries inside the candidate blocks, by score group of a ragged pass (0
    #: for any other layout)
    candidates: dict[int, Tensor] = field(default_factory=dict)


def pick_topk(ops: Backend, scores: Tensor, allowed: Tensor, k: int) -> Tensor:
    """Top-``k`` allowed entries per query: [B, S, T] -> [B, S, min(k, T)], -1 past the allowed."""
    k = min(k, scores.shape[-1])
    if k == 0:
        return torch.empty(*scores.shape[:-1], 0, dtype=torch.long, device=scores.device)
    return ops.topk_picks(scores, k, allowed=allowed)


@dataclass
class LongRange:
    """A layer's compressed entries [B, T, D] (decode rows: in their pages) and which of them
    each query sees: its top-k ``picks`` [B, S, k] (-1 = none) on a top-k layer, else a
    ``visible`` mask [B, S, T]."""

    entries: Tensor | PagedEntries
    picks: Tensor | None = None
    visible: Tensor | None = None
    #: A ragged pass's: [N] each query's span, whose entries are row span of ``entries``
    #: ([n, T, D]); picks and masks then count within the query's own span.
    span_of: Tensor | None = None
    #: Decode rows of a layer without picks: ``visible`` as a list of entries [B, 1, T]
    #: (-1 = none), made once per step (:func:`.visibility.visible_entries`).
    listed: Tensor | None = None
    #: The pass's memo, for a layer without picks: its rows of the entries (:meth:`index`) are
    #: those of every layer of the pass whose mask is this one.
    memo: StepMemo | None = None

    def index(self, offset: int) -> Tensor:
        """[B, S, K] the entries each query sees as rows ``offset + entry`` of a key tensor
        (-1 = none): the picks, or every entry a mask shows (K = T). In a ragged pass the key
        tensor holds every span's entries one span after the other."""
        t = self.entries.shape[1]

        def base() -> Tensor | int:
            if self.span_of is None:
                return offset
            return (offset + self.span_of * t)[None, :, None]

        if self.picks is not None:
            return torch.where(self.picks >= 0, self.picks + base(), -1)
        visible = self.visible
        assert visible is not None

        def rows() -> Tensor:
            return torch.where(visible, base() + torch.arange(t, device=visible.device), -1)

        return rows() if self.memo is None else self.memo.get(("rows", id(visible), offset), rows)

    def verify_pages(self, memo: StepMemo) -> KeyPages:
        """The entries verification rows ([B, S]) see, to be read in place with each query as
        its own decode row ([B * S] rows, row b's S queries one after another): a top-k
        layer's picks, otherwise every visible entry (``listed``)."""
        seen = self.picks if self.picks is not None else self.listed
        assert seen is not None and isinstance(self.entries, PagedEntries)
        b, s = seen.shape[:2]
        index = self.entries.index
        pages = memo.get(
            ("verify entry pages", id(index), s), lambda: index.repeat_interleave(s, dim=0)
        )
        return KeyPages(self.entries.pages, pages, seen.reshape(b * s, 1, -1))

    def decode_pages(self) -> KeyPages:
        """The entries decode rows (one query each) see, to be read in place: a top-k layer's
        picks, otherwise every visible entry (``listed``, or listed from ``visible``)."""
        seen = self.picks if self.picks is not None else self.listed
        if seen is None:
            assert self.visible is not None
            seen = listed(self.visible)
        assert seen.shape[1] == 1, "one query per row"
        if isinstance(self.entries, PagedEntries):
            return KeyPages(self.entries.pages, self.entries.index, seen)
        rows = torch.arange(self.entries.shape[0], device=seen.device)[:, None]
        return KeyPages(self.entries, rows, seen)  # each row's entries: one page


def candidate_blocks(
    ops: Backend, scores: Tensor, visible: Tensor, block: int, topk_blocks: int
) -> Tensor:
    """Entries inside the ``topk_blocks`` blocks with the highest max visible score.

    ``scores``/``visible`` [B, S, T]; returns a [B, S, T] bool mask (visible entries only).
    """
    b, s, t = scores.shape
    n_blocks = -(-t // block)
    pad = n_blocks * block - t
    masked = scores.masked_fill(~visible, float("-inf"))
    masked = torch.nn.functional.pad(masked, (0, pad), value=float("-inf"))
    block_max = masked.view(b, s, n_blocks, block).amax(dim=-1)
    has_visible = block_max > float("-inf")
    chosen = pick_topk(ops, block_max, has_visible, topk_blocks)  # [B, S, kb], -1 = none
    keep = torch.zeros(b, s, n_blocks + 1, dtype=torch.bool, device=scores.device)
    keep.scatter_(-1, torch.where(chosen < 0, n_blocks, chosen), True)
    per_entry = keep[..., :n_blocks].repeat_interleave(block, dim=-1)[..., :t]
    return per_entry & visible


class SharedIndexer(nn.Module):
    """The indexer parts one V4.1 layer owns: keys (KV source) and/or queries (index source)."""

    def __init__(
        self, cfg: ModelConfig, *, owns_keys: bool, owns_query: bool, dtype: torch.dtype
    ) -> None:
        super().__init__()
        self.n_heads = cfg.index_n_heads
        self.head_dim = cfg.index_head_dim
        self.topk = cfg.index_topk
        self.block = cfg.candidate_block_size
        self.topk_blocks = cfg.candidate_topk_blocks
        if owns_query:
            self.wq_b = Linear(
                cfg.q_lora_rank, self.n_heads * self.head_dim, dtype, fp8_capable=True
            )
            self.weights_proj = Linear(cfg.hidden_size, self.n_heads, dtype)
        if owns_keys:
            self.wk = Linear(cfg.head_dim, self.head_dim, dtype)
            self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)

    def keys(self, ops: Backend, latents: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        """Index keys [B, n, c] of new un-rotated latents [B, n, D] at their entry positions."""
        return self.k_norm.rotated(ops, self.wk(ops, latents), cos, sin)

    def scores(
        self,
        ops: Backend,
        x: Tensor,
        qr: Tensor,
        positions: Tensor,
        *,
        rotary: Rotary,
        keys: Tensor | PagedEntries,
    ) -> Tensor:
        """[B, S, T] fp32 scores of the queries at ``positions`` against every key."""
        b, s = x.shape[:2]
        q = self.wq_b(ops, qr).view(b, s, self.n_heads, self.head_dim)
        cos, sin = rotary.cos_sin(positions)
        q = ops.rope(q, cos, sin)
        scale = self.head_dim**-0.5 * self.n_heads**-0.5  # applied where the scores read them
        return ops.indexer_scores(q, keys, self.weights_proj(ops, x), scale)

    def select(
        self,
        ops: Backend,
        scores: Tensor,
        visible: Tensor,
        *,
        within: Tensor | None,
        publish_candidates: bool,
        own_candidates: bool,
    ) -> tuple[Tensor, Tensor | None]:
        """Returns (top-k picks [B, S, k], candidate mask if this layer publishes one).

        ``within``: the candidate mask of an earlier candidate source to restrict this layer to.
        """
        candidates = None
        if publish_candidates:
            candidates = candidate_blocks(ops, scores, visible, self.block, self.topk_blocks)
        allowed = visible
        if within is not None:
            allowed = allowed & within
        if candidates is not None and own_candidates:
            allowed = allowed & candidates
        return pick_topk(ops, scores, allowed, self.topk), candidates
