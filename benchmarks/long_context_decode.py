"""Decode step time at long contexts, with real V4.1 / V4 attention shapes in a few layers.

The tiny models' entries are 64 wide and their contexts short, so what a decode step does with
a long context's compressed entries barely shows there. This benchmark builds random-weight
models whose attention has the published sizes (64 heads of 512, sliding window 128, index
heads x 128 with top-512, V4.1's candidate blocks) but few layers and a small hidden size:

* ``v41``: 8 layers, ratios 0,0,2,2,2,1,1,1, KV sources 2 and 5, index sources 2, 5, 7
  (the embedded tiny V4.1's layout; V4.1-Flash has 4 KV sources in 40 layers);
* ``v4``: 6 layers, ratios 0,0,4,128,4,128 (V4-Flash's schedule, cut short).

For each context length L one sequence is prefilled, its state copied into B slots (entries in
pages, as the engine holds them) and ``forward_decode`` timed through CUDA graphs (median of
20 synchronised steps after the capture; eager on a CPU, for a smoke run). Also recorded: the
peak memory a step allocates beyond the states, and row 0's logits against the same sequence
decoded alone without slots (again in float32 at one context: in bf16 a pick or two of 512
can flip between the paths).

    python benchmarks/long_context_decode.py --device cuda --backend sm100 \
        [--archs v41 v4] [--contexts 8000 32000 120000] [--batches 1 8 32]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from _results import write_result

from deepinfer import plugins
from deepinfer.assets import TINY_DIR, init_random_weights
from deepinfer.cache.slots import StateSlots
from deepinfer.config import ModelConfig
from deepinfer.models import model_class
from deepinfer.models.batch import ForwardBatch
from deepinfer.models.deepseek_v4 import DeepseekV4ForCausalLM
from deepinfer.models.graphs import DecodeGraphs
from deepinfer.models.layouts import page_table_of
from deepinfer.models.state_views import clone_state

ATTENTION = {
    "num_attention_heads": 64,
    "head_dim": 512,
    "qk_rope_head_dim": 64,
    "sliding_window": 128,
    "index_head_dim": 128,
    "index_topk": 512,
    "max_position_embeddings": 1 << 20,
}
SMALL = {
    "hidden_size": 1024,
    "q_lora_rank": 512,
    "o_groups": 8,
    "o_lora_rank": 512,
    "moe_intermediate_size": 256,
    "num_nextn_predict_layers": 0,
}
YARN = {
    "type": "yarn",
    "factor": 16,
    "original_max_position_embeddings": 65536,
    "beta_fast": 32,
    "beta_slow": 1,
}


def config(arch: str) -> ModelConfig:
    if arch == "v41":
        raw = json.loads((TINY_DIR / "config.json").read_text())
        text = raw["text_config"]
        text.update(ATTENTION, **SMALL)
        text.update(
            index_n_heads=32,
            candidate_topk_blocks=2048,
            candidate_block_size=8,
            engram_layer_ids=[],  # its token map comes from a tokenizer; no part of attention
            compress_ratios=[0, 0, 2, 2, 2, 1, 1, 1],
            rope_scaling=dict(YARN, rope_type="yarn"),
        )
        return ModelConfig.from_dict(raw)
    return ModelConfig.from_dict(
        {
            "model_type": "deepseek_v4",
            "vocab_size": 8192,
            "num_hidden_layers": 6,
            "num_key_value_heads": 1,
            "n_routed_experts": 8,
            "num_experts_per_tok": 2,
            "n_shared_experts": 1,
            "num_hash_layers": 1,
            "index_n_heads": 64,
            "compress_ratios": [0, 0, 4, 128, 4, 128, 0],
            "hc_mult": 4,
            "rope_scaling": YARN,
            "bos_token_id": 0,
            "eos_token_id": 1,
            **ATTENTION,
            **SMALL,
        }
    )


def build(arch: str, dtype: torch.dtype, device: str, backend: str) -> DeepseekV4ForCausalLM:
    cfg = config(arch)
    model = model_class(cfg.model_type)(cfg, dtype=dtype, device=device)
    init_random_weights(model, seed=1)
    model.ops = plugins.backends.load(backend)(device)
    return model.eval()


@torch.inference_mode()
def measure(
    model: DeepseekV4ForCausalLM, context: int, batches: list[int], device: str
) -> list[dict[str, Any]]:
    g = torch.Generator().manual_seed(context)
    prompt = torch.randint(3, 8000, (context,), generator=g).to(device)
    alone = model.new_state(1)
    for start in range(0, context, 4096):
        model.step(prompt[None, start : start + 4096], alone)
    rows = []
    for b in batches:
        slots = StateSlots(
            lambda: model.new_state(1), max_slots=b, max_len=context + 4096, initial_slots=b
        )
        states = [slots.adopt(clone_state(alone)) for _ in range(b)]
        found = page_table_of(states[0])
        if found is not None:  # pages for every timed step now: growing them is no step's cost
            for st in states:
                found[0].ensure(st.layers[0].swa.slot, context + 32)
        reference = clone_state(alone)
        cuda = device.startswith("cuda")
        graphs = DecodeGraphs(b) if cuda else None
        ids = torch.randint(3, 8000, (b,), generator=g).to(device)
        ids[0] = 5
        sync = torch.cuda.synchronize if cuda else lambda: None
        sync()
        before = torch.cuda.memory_allocated() if cuda else 0
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        logits = model(
            ForwardBatch.decode(ids, states), graphs
        ).logits  # captures this bucket's step
        want = model.step(ids[:1, None], reference)[0, -1]
        error = float((logits[0] - want).abs().max())
        times = []
        for _ in range(23):
            sync()
            start = time.perf_counter()
            model(ForwardBatch.decode(ids, states), graphs)
            sync()
            times.append(time.perf_counter() - start)
        peak = torch.cuda.max_memory_allocated() - before if cuda else 0
        rows.append(
            {
                "context": context,
                "batch": b,
                "step_ms": round(statistics.median(times[3:]) * 1e3, 3),
                "step_extra_mib": round(peak / 2**20, 1),
                "row0_max_abs_diff_vs_alone": error,
            }
        )
        print(rows[-1], flush=True)
        for s in states:
            slots.release(s)
        del states, slots, graphs, reference
        if cuda:
            torch.cuda.empty_cache()
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--backend", default="sm100")
    ap.add_argument("--archs", nargs="+", default=["v41", "v4"])
    ap.add_argument("--contexts", type=int, nargs="+", default=[8000, 32000, 120000])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--check-context", type=int, default=8000, help="of the float32 check")
    ap.add_argument("--label", default="", help="recorded with the result (e.g. a commit)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    result: dict[str, Any] = {
        "benchmark": "long_context_decode",
        "label": args.label,
        "torch": torch.__version__,
        "backend": args.backend,
        "dtype": args.dtype,
        "device": torch.cuda.get_device_name(0) if args.device.startswith("cuda") else "cpu",
        "rows": {},
    }
    for arch in args.archs:
        model = build(arch, getattr(torch, args.dtype), args.device, args.backend)
        result["rows"][arch] = [
            row for ctx in args.contexts for row in measure(model, ctx, args.batches, args.device)
        ]
        del model
        # In bf16 a few of the 512 picks can flip between the two paths (their scores differ
        # in rounding), and a random model turns that into logit differences near 1; in fp32
        # the paths must agree to rounding.
        model = build(arch, torch.float32, args.device, args.backend)
        result.setdefault("float32_check", {})[arch] = measure(
            model, args.check_context, [2], args.device
        )
        del model
    name = "long_context_decode_" + ("h200" if args.device.startswith("cuda") else "cpu")
    write_result(result, args.out, name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
