"""Decode graphs captured at engine start, as vLLM does, so no run pays for a capture."""

from __future__ import annotations

import torch
from tqdm import tqdm

from deepinfer.cache.slots import StateSlots
from deepinfer.models.causal_lm import DeepseekCausalLM
from deepinfer.models.decode import run_decode
from deepinfer.models.graphs import DecodeGraphs, entry_buckets
from deepinfer.paging import PAGE_TOKENS
from deepinfer.parallel.expert_parallel import GATHER_MAX_TOKENS, find_expert_parallel

#: Longest sequences whose decode graphs are captured at startup; steps over longer ones
#: capture theirs on first use (each entry bucket's graphs hold that many tokens' entries
#: per row, which for long contexts is best not reserved before it is needed).
STARTUP_CAPTURE_TOKENS = 2048


@torch.inference_mode()
def capture_decode_graphs(
    model: DeepseekCausalLM, slots: StateSlots, graphs: DecodeGraphs, max_model_len: int
) -> None:
    """Capture the decode step of every batch bucket and every entry bucket up to
    :data:`STARTUP_CAPTURE_TOKENS`, instead of on first use inside a run. Each decodes once on
    a throwaway state, placed at the entry bucket's last position, whose slot and pages are
    then handed back (and reset when reused).

    Under expert parallelism every rank captures the same graphs in the same order, each at its
    bucket's rows of the fixed-shape exchange (buckets past :data:`GATHER_MAX_TOKENS` take the
    all-to-all, which reads counts on the host: no graph), and none on first use: later ones
    are captured by all ranks together between steps (see :mod:`deepinfer.models.graphs`)."""
    ep = find_expert_parallel(model)
    table = slots.page_table
    lengths = [1]
    if table is not None:
        fits = min(STARTUP_CAPTURE_TOKENS // PAGE_TOKENS, table.max_pages)
        pages = [b for b in entry_buckets(table.pages_per_slot) if b <= max(fits, 1)]
        lengths = [b * PAGE_TOKENS for b in pages]
    buckets = [b for b in graphs.buckets if ep is None or b <= GATHER_MAX_TOKENS]
    graphs.expert_parallel = ep
    todo = [(n, bucket) for n in lengths for bucket in buckets]
    for num_tokens, bucket in tqdm(todo, desc="capturing decode graphs", disable=None):
        state = slots.new_state()
        state.pos = min(num_tokens, max_model_len) - 1
        ids = torch.zeros(bucket, dtype=torch.long)
        if ep is not None:
            ep.step.rows = bucket
        # The decode pass itself: a ForwardBatch refuses one state in several rows.
        run_decode(model, ids, [state] * bucket, graphs)
        slots.release(state)
    if ep is not None:
        ep.step.rows = None
        graphs.capture_on_use = False
