"""Offline decode throughput: DeepInfer's engine vs HF transformers ``generate``, same weights.

One run builds a small random-weight transformers ``DeepseekV4ForCausalLM`` (every V4 attention
kind: sliding, CSA, HCA; hash and learned routing), exports it under the official names with
``tools/export_hf.py``, loads that directory into ``deepinfer.LLM`` and then times, side by side
and alternating, greedy generation of a fixed number of tokens per sequence at each batch size:

* HF: ``model.generate(ids, max_new_tokens=N, min_new_tokens=N, do_sample=False)`` on a
  [batch, prompt_len] tensor (equal lengths, so no padding is involved);
* DeepInfer: ``llm.generate(prompts, SamplingParams(temperature=0, max_tokens=N,
  ignore_eos=True))`` with all sequences submitted at once.

Output tokens per second are ``batch * N / wall seconds``; each side is timed ``--repeats``
times and the median is reported, with the ratio. Both run in this process with the same torch
thread count. Results go to ``benchmarks/results/offline_throughput_<device>.json``.

``--varied`` adds rows under nano-vllm's protocol (scaled down for a CPU): each sequence draws
its prompt and output lengths uniformly from ``--input-range`` and ``--output-range``.
DeepInfer gets each request's own ``max_tokens``; transformers, batching statically as its
users do, gets the prompts left-padded to the longest (with an attention mask) and generates the
longest output length for every row. Both count only the requested tokens (the sum of the
output lengths); the row also records how many transformers generated.

Each equal-length row also times one decode step of either model after a ``prompt_len``
prefill, and the step's *matmul floor*: the matmuls DeepInfer's step dispatches (captured with
their operands, then replayed back to back), i.e. what the step would cost if everything else
were free. HF's step over that floor bounds the speedup any implementation doing the same fp32
arithmetic with these matmuls could reach; ``max_speedup_at_peak`` bounds it again with the
floor's arithmetic run at the device's large-matmul rate (``peak_gflops``, a 1024^3 product),
which no decomposition of these small products reaches. ``max_run_speedup_at_floor`` /
``_at_peak`` bound the whole run the same way: DeepInfer's prefill of the prompts plus
``output_len`` steps, each costing only its matmuls, against transformers' measured run.

    python benchmarks/offline_throughput.py [--batches 1 32] [--prompt-len 64] [--output-len 64]
        [--varied --input-range 64 512 --output-range 32 256]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from _results import write_result
from torch.utils._python_dispatch import TorchDispatchMode

from deepinfer.cache.slots import StateSlots
from deepinfer.models.batch import ForwardBatch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))

CONFIG: dict[str, Any] = {
    "vocab_size": 8192,
    "hidden_size": 256,
    "num_hidden_layers": 6,
    "num_attention_heads": 8,
    "num_key_value_heads": 1,
    "head_dim": 64,
    "qk_rope_head_dim": 16,
    "q_lora_rank": 128,
    "o_groups": 2,
    "o_lora_rank": 64,
    "n_routed_experts": 16,
    "num_experts_per_tok": 2,
    "n_shared_experts": 1,
    "moe_intermediate_size": 128,
    "scoring_func": "sqrtsoftplus",
    "routed_scaling_factor": 1.5,
    "num_hash_layers": 1,
    "swiglu_limit": 10.0,
    "sliding_window": 64,
    "index_n_heads": 8,
    "index_head_dim": 32,
    "index_topk": 16,
    "hc_mult": 4,
    "hc_sinkhorn_iters": 20,
    "hc_eps": 1e-6,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000,
    "compress_rope_theta": 160000,
    "max_position_embeddings": 4096,
    "rope_scaling": {
        "type": "yarn",
        "factor": 16,
        "original_max_position_embeddings": 256,
        "beta_fast": 32,
        "beta_slow": 1,
    },
    "num_nextn_predict_layers": 0,
    "layer_types": [
        "sliding_attention",
        "compressed_sparse_attention",
        "heavily_compressed_attention",
        "compressed_sparse_attention",
        "heavily_compressed_attention",
        "sliding_attention",
    ],
    "compress_rates": {"compressed_sparse_attention": 4, "heavily_compressed_attention": 16},
    "bos_token_id": 0,
    "eos_token_id": 1,
}


#: ``--config narrow``: the same layers with a smaller window and top-k and narrower experts,
#: where a step's matmuls are smaller beside the rest of its work than in :data:`CONFIG` (the
#: vocabulary stays: the tiny tokenizer's 8,192 ids need it).
NARROW: dict[str, Any] = CONFIG | {
    "sliding_window": 32,
    "index_topk": 8,
    "moe_intermediate_size": 64,
}
CONFIGS = {"standard": CONFIG, "narrow": NARROW}


def build(out_dir: Path, device: str, config: dict[str, Any] = CONFIG) -> tuple[Any, Any]:
    """(HF model, DeepInfer LLM) over the same random weights."""
    from export_hf import export_model  # tools/export_hf.py
    from transformers import DeepseekV4Config, DeepseekV4ForCausalLM

    from deepinfer import LLM
    from deepinfer.assets import TINY_TOKENIZER

    torch.manual_seed(0)
    hf = DeepseekV4ForCausalLM(DeepseekV4Config(**config)).eval()
    with torch.no_grad():  # transformers leaves sinks, mHC bases and router biases at zero
        g = torch.Generator().manual_seed(1)
        for name, p in hf.named_parameters():
            if name.endswith(("sinks", "position_bias", "hc.base", "hc_base")):
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    export_model(hf, out_dir)
    (out_dir / "tokenizer.json").write_bytes(TINY_TOKENIZER.read_bytes())
    hf = hf.to(device)
    llm = LLM(str(out_dir), device=device, dtype="float32", enable_prefix_caching=False)
    return hf, llm


def time_hf(hf: Any, prompts: torch.Tensor, n: int) -> float:
    start = time.perf_counter()
    with torch.no_grad():
        out = hf.generate(
            prompts,
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
            pad_token_id=0,
        )
    elapsed = time.perf_counter() - start
    assert out.shape == (prompts.shape[0], prompts.shape[1] + n), out.shape
    return elapsed


def time_ours(llm: Any, prompts: torch.Tensor, n: int) -> float:
    from deepinfer import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
    start = time.perf_counter()
    outs = llm.generate(prompts.tolist(), params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    assert all(len(o.outputs[0].token_ids) == n for o in outs)
    return elapsed


def varied_lengths(
    batch: int, inputs: tuple[int, int], outputs: tuple[int, int], seed: int, vocab: int
) -> tuple[list[torch.Tensor], list[int]]:
    """``batch`` random prompts and output lengths drawn uniformly from the two ranges."""
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(inputs[0], inputs[1] + 1, (batch,), generator=g).tolist()
    prompts = [torch.randint(3, vocab, (n,), generator=g) for n in lens]
    return prompts, torch.randint(outputs[0], outputs[1] + 1, (batch,), generator=g).tolist()


def time_hf_varied(hf: Any, prompts: list[torch.Tensor], outputs: list[int]) -> float:
    """Static batching: prompts left-padded to the longest, every row generating the longest
    output length (transformers has no per-row ``max_new_tokens``)."""
    device = next(hf.parameters()).device
    width = max(len(p) for p in prompts)
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros(len(prompts), width, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = p
        mask[i, width - len(p) :] = 1
    n = max(outputs)
    start = time.perf_counter()
    with torch.no_grad():
        out = hf.generate(
            ids.to(device),
            attention_mask=mask.to(device),
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
            pad_token_id=0,
        )
    elapsed = time.perf_counter() - start
    assert out.shape == (len(prompts), width + n), out.shape
    return elapsed


def time_ours_varied(llm: Any, prompts: list[torch.Tensor], outputs: list[int]) -> float:
    from deepinfer import SamplingParams

    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in outputs]
    start = time.perf_counter()
    outs = llm.generate([p.tolist() for p in prompts], params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    assert [len(o.outputs[0].token_ids) for o in outs] == outputs
    return elapsed


def varied_row(hf: Any, llm: Any, batch: int, args: argparse.Namespace) -> dict[str, Any]:
    vocab = CONFIGS[args.config]["vocab_size"]
    prompts, outputs = varied_lengths(batch, args.input_range, args.output_range, batch, vocab)
    warm, _ = varied_lengths(batch, (8, 16), (2, 2), -batch, vocab)
    time_hf_varied(hf, warm, [2] * batch)
    time_ours_varied(llm, warm, [2] * batch)
    hf_s, our_s = [], []
    for _ in range(args.repeats):
        hf_s.append(time_hf_varied(hf, prompts, outputs))
        our_s.append(time_ours_varied(llm, prompts, outputs))
    tokens = sum(outputs)
    row = {
        "protocol": "varied",
        "batch": batch,
        "input_range": list(args.input_range),
        "output_range": list(args.output_range),
        "requested_output_tokens": tokens,
        "hf_generated_tokens": batch * max(outputs),
        "hf_output_tok_per_s": round(tokens / statistics.median(hf_s), 2),
        "deepinfer_output_tok_per_s": round(tokens / statistics.median(our_s), 2),
        "hf_seconds": [round(s, 3) for s in hf_s],
        "deepinfer_seconds": [round(s, 3) for s in our_s],
    }
    row["speedup"] = round(row["deepinfer_output_tok_per_s"] / row["hf_output_tok_per_s"], 2)
    return row


MATMULS = {"mm", "addmm", "bmm", "baddbmm", "_grouped_mm"}


class _CaptureMatmuls(TorchDispatchMode):
    """Records every matmul dispatched inside it, with copies of its operands."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[Any, list[Any], dict[str, Any]]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func.overloadpacket.__name__ in MATMULS:
            operands = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
            self.calls.append((func, operands, dict(kwargs)))
        return func(*args, **kwargs)


def _flops(func: Any, args: list[Any]) -> int:
    """Multiply-adds x 2 of one captured matmul."""
    name = func.overloadpacket.__name__
    if name in ("addmm", "baddbmm"):
        args = args[1:]
    a, b = args[0], args[1]
    if name == "_grouped_mm":  # [rows, k] x [groups, k, n]: each row meets one group
        return 2 * a.shape[0] * a.shape[1] * b.shape[-1]
    batch = a.shape[0] if a.dim() == 3 else 1
    return 2 * batch * a.shape[-2] * a.shape[-1] * b.shape[-1]


def peak_gflops(device: str) -> float:
    """The device's fp32 matmul rate on a large square product (1024^3), as a ceiling."""
    a = torch.randn(1024, 1024, device=device)
    return round(2 * 1024**3 / _median_ms(lambda: a @ a, device) / 1e6, 1)


def _median_ms(fn: Any, device: str, repeats: int = 10) -> float:
    times = []
    for _ in range(repeats + 2):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times[2:]) * 1e3


def _prefilled(llm: Any, prompts: torch.Tensor) -> list[Any]:
    """States as the engine keeps them (rows of shared slot tensors), after prefilling
    ``prompts``."""
    model = llm.engine.model
    slots = StateSlots(
        lambda: model.new_state(1),
        max_slots=prompts.shape[0],
        max_len=llm.engine.max_model_len,
        initial_slots=prompts.shape[0],
    )
    states = [slots.new_state() for _ in range(prompts.shape[0])]
    model(ForwardBatch.build(list(prompts), states))
    return states


@torch.no_grad()
def decode_steps(hf: Any, llm: Any, prompts: torch.Tensor, device: str) -> dict[str, float]:
    """One decode step of each model after prefilling ``prompts``, and DeepInfer's matmul floor.

    Each side runs as its ``generate`` does: DeepInfer's engine steps in inference mode,
    transformers' ``generate`` under no_grad.
    """
    model = llm.engine.model
    ids = prompts[:, -1]
    with torch.inference_mode():
        states = _prefilled(llm, prompts)
        # Each timed call advances the states by one token; the step's cost does not depend on it.
        graphs = llm.engine.runner.graphs  # as the engine runs it (CUDA graphs on a GPU)
        ours = _median_ms(lambda: model(ForwardBatch.decode(ids, states), graphs).logits, device)
    # The floor is captured outside inference mode, where composite ops (linear, einsum) reach
    # the dispatch mode already lowered to the matmuls it records; on slot rows as above (states
    # of their own would run the rows one after another, each with its own matmuls).
    states = _prefilled(llm, prompts)
    capture = _CaptureMatmuls()
    with capture:
        model(ForwardBatch.decode(ids, states))
    floor = _median_ms(lambda: [f(*a, **k) for f, a, k in capture.calls], device)
    flops = sum(_flops(f, a) for f, a, _ in capture.calls)
    peak = peak_gflops(device)
    cache = hf(prompts, use_cache=True).past_key_values
    step = prompts[:, -1:]
    theirs = _median_ms(lambda: hf(step, past_key_values=cache, use_cache=True), device)
    return {
        "hf_decode_step_ms": round(theirs, 2),
        "deepinfer_decode_step_ms": round(ours, 2),
        "deepinfer_matmul_floor_ms": round(floor, 2),
        "matmuls_per_step": len(capture.calls),
        "max_speedup_at_floor": round(theirs / floor, 2),
        "matmul_gflop_per_step": round(flops / 1e9, 4),
        "matmul_floor_gflops": round(flops / floor / 1e6, 1),
        "peak_gflops": peak,
        # the step's matmul arithmetic alone, at the device's large-matmul rate
        "max_speedup_at_peak": round(theirs / (flops / peak / 1e6), 2),
    }


@torch.no_grad()
def prefill_floor(llm: Any, prompts: torch.Tensor, device: str) -> dict[str, float]:
    """The matmuls of DeepInfer's prefill of ``prompts`` (one ragged pass over slotted
    states, as the engine runs it), captured and replayed back to back as for the step's
    floor."""
    model = llm.engine.model
    n, length = prompts.shape
    slots = StateSlots(lambda: model.new_state(1), max_slots=n, max_len=length + 1)
    states = [slots.new_state() for _ in range(n)]
    capture = _CaptureMatmuls()
    with capture:
        model(ForwardBatch.build(list(prompts), states))
    floor = _median_ms(lambda: [f(*a, **k) for f, a, k in capture.calls], device, repeats=3)
    flops = sum(_flops(f, a) for f, a, _ in capture.calls)
    return {
        "prefill_matmul_gflop": round(flops / 1e9, 3),
        "prefill_matmul_floor_ms": round(floor, 1),
    }


def end_to_end_bounds(row: dict[str, Any], output_len: int) -> dict[str, float]:
    """Upper bounds on the run's speedup over transformers: the prefill plus ``output_len``
    decode steps costing only their matmuls, at the rates they reach (``_at_floor``) and at the
    device's large-matmul rate (``_at_peak``)."""
    hf_ms = statistics.median(row["hf_seconds"]) * 1e3
    floor_ms = row["prefill_matmul_floor_ms"] + output_len * row["deepinfer_matmul_floor_ms"]
    gflop = row["prefill_matmul_gflop"] + output_len * row["matmul_gflop_per_step"]
    return {
        "max_run_speedup_at_floor": round(hf_ms / floor_ms, 2),
        "max_run_speedup_at_peak": round(hf_ms / (gflop / row["peak_gflops"] * 1e3), 2),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (both sides)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--varied", action="store_true", help="add nano-vllm-style rows (see above)")
    ap.add_argument("--input-range", type=int, nargs=2, default=(64, 512), metavar=("MIN", "MAX"))
    ap.add_argument("--output-range", type=int, nargs=2, default=(32, 256), metavar=("MIN", "MAX"))
    ap.add_argument("--config", choices=list(CONFIGS), default="standard", help="see NARROW")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    config = CONFIGS[args.config]

    with tempfile.TemporaryDirectory() as tmp:
        hf, llm = build(Path(tmp) / "model", args.device, config)
        rows = []
        for batch in args.batches:
            g = torch.Generator().manual_seed(batch)
            prompts = torch.randint(3, config["vocab_size"], (batch, args.prompt_len), generator=g)
            prompts = prompts.to(args.device)
            time_hf(hf, prompts[:, :8], 2)  # warm-up both sides
            time_ours(llm, prompts[:, :8], 2)
            hf_s, our_s = [], []
            for _ in range(args.repeats):
                hf_s.append(time_hf(hf, prompts, args.output_len))
                our_s.append(time_ours(llm, prompts, args.output_len))
            tokens = batch * args.output_len
            row = {
                "protocol": "equal",
                "batch": batch,
                "hf_output_tok_per_s": round(tokens / statistics.median(hf_s), 2),
                "deepinfer_output_tok_per_s": round(tokens / statistics.median(our_s), 2),
                "hf_seconds": [round(s, 3) for s in hf_s],
                "deepinfer_seconds": [round(s, 3) for s in our_s],
            }
            row["speedup"] = round(
                row["deepinfer_output_tok_per_s"] / row["hf_output_tok_per_s"], 2
            )
            row |= decode_steps(hf, llm, prompts, args.device)
            row |= prefill_floor(llm, prompts, args.device)
            row |= end_to_end_bounds(row, args.output_len)
            print(json.dumps(row))
            rows.append(row)
        for batch in args.batches if args.varied else []:
            rows.append(varied_row(hf, llm, batch, args))
            print(json.dumps(rows[-1]))

    import transformers

    result = {
        "benchmark": "offline_throughput",
        "device": args.device,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "threads": args.threads,
        "prompt_len": args.prompt_len,
        "output_len": args.output_len,
        "repeats": args.repeats,
        "config": {
            "name": args.config,
            **{k: config[k] for k in ("hidden_size", "num_hidden_layers", "vocab_size")},
            **{k: config[k] for k in ("sliding_window", "index_topk")},
        },
        "rows": rows,
    }
    write_result(result, args.out, f"offline_throughput_{args.device}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
