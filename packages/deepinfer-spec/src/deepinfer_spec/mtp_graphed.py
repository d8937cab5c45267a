"""The engine's MTP drafting rounds replayed from CUDA graphs, over the slotted MTP rings.

Run eagerly, a round is a ragged pass of the MTP layer over each request's newly verified
positions and ``k - 1`` chained passes of one token a request: many small kernels each, and
host work to plan the ragged pass, several times a replayed verification step on a GPU. Here
the whole round is one graph per batch bucket, captured at engine start with the decode steps
(:meth:`GraphedMTPRounds.capture`) and sharing the engine's :class:`DecodeGraphs`:

* the newly verified positions feed the layer as rows of ``k + 1`` tokens, as the target's
  verification pass feeds its rows (:class:`~deepinfer.models.layouts.SlotTokens`: row i's
  first ``lengths[i]`` tokens real, padding written to the slot tensors' padding row); a round
  after a verification step absorbs at most ``k + 1``, and longer runs (after a prefill chunk
  or plain steps) feed their earlier positions through an eager ragged pass first;
* each row's last real token gives the first draft, and the chained drafts are decode passes
  at the positions after it, written to the ring rows past the verified ones (taken back when
  the next round writes there: the host counters stay at the verified positions).

The drafts are the eager passes' (the same layer on the same rows; a GPU test checks the
drafts kept are the same).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch
from torch import Tensor

from deepinfer.models.causal_lm import DeepseekCausalLM
from deepinfer.models.graphs import DecodeGraphs
from deepinfer.models.layers.block import ForwardContext
from deepinfer.models.layouts import SlotRows, SlotTokens
from deepinfer.models.mtp_pass import mtp_forward_ragged
from deepinfer.models.state import ModelState
from deepinfer.transfer import to_device
from deepinfer_spec.confidence import confident


class GraphedMTPRounds:
    """MTP drafting rounds of ``k`` drafts a request from graphs (see the module)."""

    def __init__(self, model: DeepseekCausalLM, graphs: DecodeGraphs, k: int) -> None:
        self.model = model
        self.graphs = graphs
        self.k = k
        self.rows = k + 1  # verified positions a round absorbs in its graph

    @torch.inference_mode()  # as the engine's captures: their shared buffers are shared here
    def capture(self, state: ModelState) -> None:
        """Capture every batch bucket's round now over the MTP ring of ``state`` (a throwaway
        state of the engine's slots): made-up rounds of padding rows only."""
        model, cfg, m = self.model, self.model.cfg, self.rows
        for bucket in self.graphs.buckets:
            ids = torch.zeros(bucket, m, dtype=torch.long, device=model.device)
            streams = torch.zeros(
                bucket, m, cfg.hc_mult, cfg.hidden_size, dtype=model.dtype, device=model.device
            )
            self._run(state, streams, ids, ids, ids, ids[:, 0], ids[:, 0])

    def draft(
        self, states: Sequence[ModelState], streams: Tensor, next_ids: Tensor, lengths: list[int]
    ) -> tuple[Tensor, Tensor]:
        """The drafts [n, k] and their confidences, as
        :meth:`~deepinfer_spec.mtp.MTPDrafter.draft_with_confidence` (span i feeds
        ``lengths[i]`` rows of ``streams`` [N, hc, d] and ``next_ids`` [N]); each state's MTP
        layer ends at its verified positions."""
        m, model = self.rows, self.model
        offsets = [0, *itertools.accumulate(lengths)]
        long = [i for i, n in enumerate(lengths) if n > m]
        if long:  # their earlier positions go through the layer first, eagerly
            early = [j for i in long for j in range(offsets[i], offsets[i + 1] - m)]
            pick = to_device(torch.tensor(early), streams.device)
            firsts = [lengths[i] - m for i in long]
            long_states = [states[i] for i in long]
            mtp_forward_ragged(model, long_states, streams[pick], next_ids[pick], firsts)
        # per request: its rows' slots, positions and rows of ``streams`` (len(streams): the
        # zero row), its real rows and its slot; one host-to-device copy for the lot
        plan: list[list[int]] = []
        for state, n, end in zip(states, lengths, offsets[1:], strict=True):
            ring, tail = state.mtp[0].swa, min(n, m)
            start, pad = state.mtp_pos, [0] * (m - tail)
            plan.append([*[ring.slot] * tail, *pad, *range(start, start + tail), *pad,
                         *range(end - tail, end), *[len(streams)] * (m - tail),
                         tail, ring.slot])  # fmt: skip
            ring.length = start + tail  # as the eager pass leaves them
            if len(state.mtp) == 1:
                state.mtp_pos = start + tail
        at = to_device(torch.tensor(plan), streams.device)
        rows = at[:, 2 * m : 3 * m]
        padded = torch.cat((streams, streams.new_zeros(1, *streams.shape[1:])))
        ids = torch.cat((next_ids, next_ids.new_zeros(1)))
        tok_slots, positions = at[:, :m], at[:, m : 2 * m]
        return self._run(
            states[0], padded[rows], ids[rows], positions, tok_slots, *at[:, 3 * m :].T
        )

    def _run(self, state: ModelState, *inputs: Tensor) -> tuple[Tensor, Tensor]:
        """The round's graph of this batch's bucket over ``state``'s slot tensor."""
        pool = state.mtp[0].swa.pool
        assert pool is not None
        model, block, k = self.model, self.model.mtp[0], self.k

        def passes(  # noqa: PLR0917
            streams: Tensor,
            ids: Tensor,
            positions: Tensor,
            tok_slots: Tensor,
            lengths: Tensor,
            slots: Tensor,
        ) -> tuple[Tensor, Tensor]:
            tokens = SlotTokens(positions, tok_slots, lengths)
            ctx = ForwardContext(model.ops, positions, ids, model.rotary)
            rows = SlotRows(pool, slots, tokens=tokens)
            hidden, x = block.predict(streams, model.embed(ids), ctx, rows)
            every, last = torch.arange(len(ids), device=ids.device), (lengths - 1).clamp(min=0)
            out, position = x[every, last], positions[every, last] + 1
            picks = [confident(model.head(model.ops, hidden[every, last]))]
            for j in range(k - 1):
                step = picks[-1][0][:, None]
                ctx = ForwardContext(model.ops, (position + j)[:, None], step, model.rotary)
                hidden, x = block.predict(
                    out[:, None], model.embed(step), ctx, SlotRows(pool, slots)
                )
                out = x[:, 0]
                picks.append(confident(model.head(model.ops, hidden[:, 0])))
            return torch.stack([t for t, _ in picks], 1), torch.stack([c for _, c in picks], 1)

        key = ("mtp", self.k, pool.data_ptr())
        tokens, confidence = self.graphs.run(key, passes, *inputs)
        # the graph's outputs are shared buffers the next replay overwrites
        return tokens.clone(), confidence.clone()
