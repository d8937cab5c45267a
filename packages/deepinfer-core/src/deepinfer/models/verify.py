"""Verification rows over shared slot rows: a few tokens a row, in one capturable pass.

Speculative decoding feeds each decoding request its last token and its drafts, a row of up to
k + 1 tokens that keeps every logit. The ragged pass runs any mix of spans but plans each step on
the host, so it cannot be captured. A step of verification rows only has a fixed shape instead:
[B, T] tokens, row i's first ``lengths[i]`` real and the rest padding whose state writes go to
the slot tensors' padding row (:class:`~deepinfer.models.layouts.SlotTokens`). Each layer writes
the rows' T ring rows (:func:`~deepinfer.models.layers.window.ring_rows`), pools each
row's candidate windows (:mod:`~deepinfer.models.layers.verify_windows`) and attends with each
query as its own decode row, the rings and entry pages read in place (``paged_attention``); all
indices come from the positions on the device. So the
whole pass is captured on a GPU, once per batch bucket, T and entry bucket, as decode steps are
(:mod:`.graphs`).

A row of L real tokens needs a state with rollback slack of at least L - 1: a ring of
``window + slack`` rows keeps what every query sees while the row writes its L rows (padding
writes none of the row's, so T may exceed it). V4.1's Engram look-back moves on past each row's
real tokens only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import pad_sequence

from deepinfer.models.batch import ForwardBatch
from deepinfer.models.decode import graph_shape, slot_decodable, step_rows
from deepinfer.models.graphs import DecodeGraphs
from deepinfer.models.layer_capture import captured_layers, features_of
from deepinfer.models.layouts import SlotTokens, page_table_of
from deepinfer.models.state import ModelState
from deepinfer.models.trunk import LayerInputs, StepModel
from deepinfer.parallel.expert_parallel import find_expert_parallel
from deepinfer.transfer import to_device


def verifies(model: nn.Module, batch: ForwardBatch, capture: bool) -> bool:
    """Whether ``batch`` runs as the verification pass: text only, every span keeping all
    its logits with no record points, each fitting its state's slack (:func:`verify_fits`),
    and some span of several tokens, or streams or (``capture``) layer outputs to return
    (else single-token rows take the decode pass); no expert parallelism."""
    spans = batch.spans
    if batch.image_embeds is not None:
        return False
    if any(s.num_logits != s.num_tokens or s.record_at for s in spans):
        return False
    if not (capture or batch.return_streams) and all(s.num_tokens == 1 for s in spans):
        return False
    if not verify_fits([s.state for s in spans], [s.num_tokens for s in spans]):
        return False
    # Under expert parallelism the ranks agree on each step's real tokens; padded rows would
    # feed the MoE exchange more.
    return find_expert_parallel(model) is None


def verify_fits(states: Sequence[ModelState], lengths: Sequence[int]) -> bool:
    """Whether rows of ``lengths`` tokens over ``states`` can run as one verification pass:
    every state slotted (Engram history included), with the slack its row needs."""
    if not slot_decodable(states):
        return False
    return all(0 < n <= s.slack + 1 for s, n in zip(states, lengths, strict=True))


@dataclass
class VerifyResult:
    """A verification pass's outputs at every real token, in row order."""

    logits: Tensor  # [sum L_i, V] fp32
    streams: Tensor  # [sum L_i, hc, d] final residual streams
    features: Tensor | None  # [sum L_i, F] the captured layers' outputs (None: none asked)


def run_verify(  # noqa: PLR0917
    model: StepModel,
    chunks: Sequence[Tensor],
    states: Sequence[ModelState],
    graphs: DecodeGraphs | None,
    width: int | None = None,
    capture: Sequence[int] = (),
    drafts: Tensor | None = None,
) -> VerifyResult:
    """Feed ``chunks[i]`` ([L_i] ids) to ``states[i]`` (:func:`verify_fits`) as rows of
    ``width`` tokens (default: the longest row), through ``graphs`` on a GPU; the outputs of
    layers ``capture`` come back as features (from the graph too). ``drafts`` [rows, k] on
    the device: each row's ids after its first (placeholders in ``chunks``), copied in there,
    so the pass need not wait for the host to read them."""
    lengths = [int(c.numel()) for c in chunks]
    t = max(lengths) if width is None else width
    if t < max(lengths):
        raise ValueError(f"a row of {max(lengths)} tokens does not fit width {t}")
    # built from lists, a few host ops for the lot: a step's host work is its cost at batch 1
    ids = pad_sequence([c.reshape(-1).long() for c in chunks], batch_first=True)
    if ids.shape[1] < t:
        ids = F.pad(ids, (0, t - ids.shape[1]))
    placed = list(zip(states, lengths, strict=True))
    where = torch.tensor(  # positions, slots, real
        [
            [[s.pos + j if j < n else 0 for j in range(t)] for s, n in placed],
            [[s.slot if j < n else 0 for j in range(t)] for s, n in placed],
            [[int(j < n) for j in range(t)] for _, n in placed],
        ]
    )
    ids, where = to_device(ids, model.device), to_device(where, model.device)
    if drafts is not None:  # (past a row's length too: those positions are not real)
        w = min(drafts.shape[1], t - 1)
        ids[:, 1 : 1 + w] = drafts[:, :w]
    slots = where[1, :, 0]
    found = page_table_of(states[0])
    if found is not None:  # the rows write their entries by index: hold their pages
        ends = [s.pos + n for s, n in zip(states, lengths, strict=True)]
        found[0].ensure_all([s.slot for s in states], ends)
    template = states[0].layers
    history = states[0].history_pool
    num_tokens = max(s.pos + n for s, n in zip(states, lengths, strict=True))
    layers = tuple(capture)

    def step(  # noqa: PLR0917
        ids: Tensor, positions: Tensor, tok_slots: Tensor, real: Tensor, slots: Tensor, n: int
    ) -> tuple[Tensor, ...]:
        tokens = SlotTokens(positions, tok_slots, real.sum(dim=1))
        engram = None
        if history is not None:
            engram = engram_rows(model, ids, history, slots, tokens.lengths)
        rows = step_rows(template, slots, n, tokens)
        with captured_layers(model, layers) as seen:  # type: ignore[arg-type]
            logits, x = model.run_layers(LayerInputs(ids, positions, rows, engram_ids=engram))
        if not layers:
            return logits, x
        return logits, x, features_of(seen, layers).view(*ids.shape, -1)

    args = (ids, where[0], where[1], where[2], slots)
    if graphs is not None and model.ops.supports_cuda_graphs(model.dtype):
        num_tokens, addresses = graph_shape(found, num_tokens, template, history)
        key = ("verify", t, num_tokens, layers, *addresses)
        outs = graphs.run(key, lambda *a: step(*a, num_tokens), *args)
    else:
        outs = step(*args, num_tokens)
    for s, n in zip(states, lengths, strict=True):  # counters follow when next read
        s.pos += n
        s.counters_behind = True
    keep = to_device(
        torch.tensor([i * t + j for i, n in enumerate(lengths) for j in range(n)]), model.device
    )
    real = [out.flatten(0, 1).index_select(0, keep) for out in outs]
    return VerifyResult(real[0], real[1], real[2] if layers else None)


def engram_rows(
    model: StepModel, ids: Tensor, history: Tensor, slots: Tensor, lengths: Tensor
) -> Tensor | None:
    """V4.1 Engram's compressed ids with the look-back in front [B, H + T] for verification
    rows ``ids`` [B, T]; each row's look-back moves on past its real tokens only."""
    before = history.index_select(0, slots)
    engram, _ = model.engram_ids(ids, before)
    raw = torch.cat((before, ids), dim=1)
    h = history.shape[1]
    history[slots] = raw.gather(1, lengths[:, None] + torch.arange(h, device=ids.device))
    return engram


def with_drafts(batch: ForwardBatch, drafts: Tensor) -> ForwardBatch:
    """``batch`` with span i's tokens after its first taken from ``drafts[i]`` (read from
    the device: a pass other than verification reads its ids on the host)."""
    if any(span.rows != 1 for span in batch.spans):
        raise ValueError("drafts continue single-row spans only")
    ids, rows = batch.input_ids.clone(), drafts.tolist()
    for i, span in enumerate(batch.spans):
        n, at = span.num_tokens - 1, batch.offsets[i] + 1
        ids[at : at + n] = torch.tensor(rows[i][:n], dtype=ids.dtype)
    return dataclasses.replace(batch, input_ids=ids)
