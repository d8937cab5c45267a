"""Launch shapes of the sm100 attention, index-score, top-k and ``hc_mix`` kernels, side by side.

Each call is timed as the engine runs it, inside a CUDA graph (10 calls captured, replayed;
the median per call), so a kernel's own time shows rather than Python's launch cost, which
for a single small call is larger than the kernel. Sections (``--parts``):

* ``attention``: decode with V4's attention shapes (64 heads of 512, 640 or 1152 keys, bf16;
  640 in float32 at B = 8/32/128) at B = 1/8/32/128, a tiny model's decode (4 heads of 64) and a
  512-query sparse prefill chunk, under each of ``VARIANTS`` (heads per program, keys per
  block, output columns per program, warps, 16-bit QK dots, split target, bf16 parts of the
  probabilities, rows from which a launch takes 256 columns); ``--baseline`` adds an earlier
  ``attention.py`` (e.g. from ``git show REV:packages/deepinfer-kernels-sm100/src/
  deepinfer_kernels_sm100/attention.py``) as ``orig``, and each variant's largest difference
  from it;
* ``hc_mix``: 4k and 16k columns (hidden 1024 / 4096 x 4 streams), 1 to 4096 rows, at
  several column splits; ``--mhc-baseline`` adds an earlier ``mhc.py``'s ``hc_mix`` beside
  the shipped one;
* ``indexer``: the paged index scores of V4.1's ratio-1 layers (32 heads x 128, 32k / 120k
  entries) and V4's ratio-4 ones (64 heads, 8k entries) at B = 1 / 32 under each of
  ``INDEXER_VARIANTS``, beside the time to read the keys once at 4.8 TB/s.

* ``compress``: the compressor's softmax pooling of windows into entries (V4's ratio-128 and
  overlapping ratio-4 windows, 512 and 128 wide) at decode and over a 4096-token chunk, by the
  reference's torch ops and by the sm100 kernel.

* ``topk``: the indexers' stable top-k picks (512 of 8k-120k entries, 2048 of 4k, 1 to 128
  rows, entries past ``n_visible`` masked) by the reference's torch ops and by the sm100
  kernel under each of ``TOPK_VARIANTS`` (entries per block, warps, programs a pass); every
  variant's picks must equal the reference's.

``--steps`` also times whole captured decode steps of ``long_context_decode.py``'s models at
32k tokens under the given attention variants.

    python benchmarks/attention_kernels.py [--baseline old_attention.py] [--steps VARIANT ...]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import time
from functools import partial
from pathlib import Path
from typing import Any

import torch
from _results import write_result

from deepinfer.models.batch import ForwardBatch

#: Rows that never come: a variant that keeps BLOCK_DV at any launch size.
NEVER = 1 << 30
#: name: (BLOCK_H, BLOCK_L, BLOCK_DV, NUM_WARPS, QK_NATIVE, TARGET_PROGRAMS, PV_PARTS,
#: WIDE_ROWS); a target of 0 never splits the keys; 0 parts: the probabilities meet the values
#: in IEEE fp32 dots; from WIDE_ROWS (row, head block) pairs a launch takes 256 columns.
VARIANTS: dict[str, tuple[int, int, int, int, bool, int, int, int]] = {
    "a_h16_ieeeqk_nosplit": (16, 64, 128, 4, False, 0, 0, NEVER),
    "b_h16_native_nosplit": (16, 64, 128, 4, True, 0, 0, NEVER),
    "c_h16_native_split264": (16, 64, 128, 4, True, 264, 0, NEVER),
    "d_h16_native_split528": (16, 64, 128, 4, True, 528, 0, NEVER),
    "e_h64_dv128_w4_split": (64, 64, 128, 4, True, 264, 0, NEVER),
    "f_h64_dv128_w8_split": (64, 64, 128, 8, True, 264, 0, NEVER),
    "g_h32_dv128_w4_split": (32, 64, 128, 4, True, 264, 0, NEVER),
    "h_h64_dv256_w8_split": (64, 64, 256, 8, True, 264, 0, NEVER),
    "i_h16_dv256_w8_split": (16, 64, 256, 8, True, 264, 0, NEVER),
    "j_h64_l32_dv128_w4_split": (64, 32, 128, 4, True, 264, 0, NEVER),
    "k_h32_dv256_w8_split": (32, 64, 256, 8, True, 264, 0, NEVER),
    "l_h64_dv128_w8_nosplit": (64, 64, 128, 8, True, 0, 0, NEVER),
    "m_h64_dv256_w8_split528": (64, 64, 256, 8, True, 528, 0, NEVER),
    "n_h32_dv128_w4_split528": (32, 64, 128, 4, True, 528, 0, NEVER),
    "o_h16_native_split1056": (16, 64, 128, 4, True, 1056, 0, NEVER),
    "p_h64_dv128_w8_split128": (64, 64, 128, 8, True, 128, 0, NEVER),
    "q_h64_dv128_w8_split128_pv3": (64, 64, 128, 8, True, 128, 3, NEVER),
    "r_h64_dv128_w8_split128_pv2": (64, 64, 128, 8, True, 128, 2, NEVER),
    "s_h64_dv256_w8_split128_pv3": (64, 64, 256, 8, True, 128, 3, NEVER),
    "t_h64_dv128_w8_split128_pv3_wide32": (64, 64, 128, 8, True, 128, 3, 32),  # the defaults
}
#: (name, batch, queries, heads, keys, head dim, sparse)
CASES = [
    *[("v4-decode-640", b, 1, 64, 640, 512, False) for b in (1, 8, 32, 128)],
    *[("v4-decode-1152", b, 1, 64, 1152, 512, False) for b in (1, 32)],
    *[("tiny-decode", b, 1, 4, 80, 64, False) for b in (1, 128)],
    *[("v4-decode-640-fp32", b, 1, 64, 640, 512, False) for b in (8, 32, 128)],  # fp32 kv
    ("v4-prefill-sparse", 1, 512, 64, 4096, 512, True),
]


def graph_us(fn: Any, replays: int = 10) -> float:
    """Median GPU time of one ``fn()`` in microseconds: 10 calls in a CUDA graph, replayed."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(10):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 10)
    return round(statistics.median(times) * 1e3, 1)


#: The attention module's constants a variant sets, in VARIANTS' order.
KNOBS = (
    "BLOCK_H",
    "BLOCK_L",
    "BLOCK_DV",
    "NUM_WARPS",
    "QK_NATIVE",
    "TARGET_PROGRAMS",
    "PV_PARTS",
    "WIDE_ROWS",
)


def use(att: Any, variant: str | tuple[Any, ...]) -> None:
    values = VARIANTS[variant] if isinstance(variant, str) else variant
    for knob, value in zip(KNOBS, values, strict=True):
        setattr(att, knob, value)


def attention_rows(att: Any, orig: Any | None, variants: list[str]) -> list[dict[str, Any]]:
    g = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for name, b, s, h, keys, dim, sparse in CASES:
        dtype = torch.float32 if name.endswith("-fp32") else torch.bfloat16
        q = torch.randn(b, s, h, dim, device="cuda", generator=g).to(dtype)
        kv = torch.randn(b, keys, dim, device="cuda", generator=g).to(dtype)
        sinks = torch.randn(h, device="cuda", generator=g)
        if sparse:
            picks = [torch.randperm(keys, device="cuda", generator=g)[:640] for _ in range(s)]
            select = torch.stack(picks)[None]
        else:
            select = torch.rand(b, s, keys, device="cuda", generator=g) > 0.1
        form = "sparse_mqa_sink_attention" if sparse else "mqa_sink_attention"
        row: dict[str, Any] = {"case": name, "B": b, "S": s}
        ref = None
        if orig is not None:
            old = getattr(orig, form)
            row["orig_us"] = graph_us(partial(old, q, kv, select, sinks, 0.04))
            ref = old(q, kv, select, sinks, 0.04).float()
        new = getattr(att, form)
        for variant in variants:
            use(att, variant)
            row[variant] = graph_us(partial(new, q, kv, select, sinks, 0.04))
            if ref is not None:
                got = new(q, kv, select, sinks, 0.04).float()
                row["diff_" + variant[:1]] = float((got - ref).abs().max())
        print(row, flush=True)
        rows.append(row)
    return rows


#: (name, batch, windows, ratio, entry width, overlapping windows)
COMPRESS_CASES = [
    *[("v4-hca-decode", b, 1, 128, 512, False) for b in (1, 32)],
    *[("v4-csa-decode", b, 1, 4, 512, True) for b in (1, 32)],
    ("v4-index-decode", 32, 1, 4, 128, True),
    ("v4-hca-prefill-4096", 1, 32, 128, 512, False),
    ("v4-csa-prefill-4096", 1, 1024, 4, 512, True),
]


def compress_rows() -> list[dict[str, Any]]:
    """The compressor's softmax pooling: the torch reference's ops against the sm100 kernel."""
    from deepinfer.backends.torch_ref import TorchBackend
    from deepinfer_kernels_sm100.compress import softmax_pool

    reference = TorchBackend("cuda").compress
    g = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for name, b, n, r, d, overlap in COMPRESS_CASES:
        kv = torch.randn(b, n, r, d * (2 if overlap else 1), device="cuda", generator=g)
        score = torch.randn(kv.shape, device="cuda", generator=g)
        prev = [torch.randn(b, r, d, device="cuda", generator=g) for _ in range(2)]
        args = (kv, score, *(prev if overlap else (None, None)), overlap)
        diff = (softmax_pool(*args) - reference(*args)).abs().max()
        row = {"case": name, "B": b, "reference_us": graph_us(partial(reference, *args))}
        row |= {"kernel_us": graph_us(partial(softmax_pool, *args)), "max_diff": float(diff)}
        print(row, flush=True)
        rows.append(row)
    return rows


#: name: (BLOCK_H, BLOCK_T, NUM_WARPS, 16-bit dots as they are)
INDEXER_VARIANTS: dict[str, tuple[int, int, int, bool]] = {
    "h16_t64_upcast": (16, 64, 4, False),
    "h16_t64": (16, 64, 4, True),
    "h32_t64": (32, 64, 4, True),
    "h64_t64_w8": (64, 64, 8, True),
    "h16_t128": (16, 128, 4, True),
    "h32_t128_w8": (32, 128, 8, True),
    "h16_t32": (16, 32, 4, True),
}


def indexer_rows(att: Any, indexer: Any) -> list[dict[str, Any]]:
    from deepinfer.paging import PagedEntries

    g = torch.Generator(device="cuda").manual_seed(2)
    chosen = (indexer.BLOCK_H, indexer.BLOCK_T, indexer.NUM_WARPS, att.QK_NATIVE)
    rows = []
    for name, b, heads, limit, page_rows in (
        ("v41-ratio1-32k", 1, 32, 32768, 128),
        ("v41-ratio1-32k", 32, 32, 32768, 128),
        ("v41-ratio1-120k", 1, 32, 120064, 128),
        ("v4-ratio4-32k", 1, 64, 8000, 32),
        ("v4-ratio4-32k", 32, 64, 8000, 32),
    ):
        cols = -(-limit // page_rows)
        pages = torch.randn(b * cols + 1, page_rows, 128, device="cuda", generator=g).bfloat16()
        index = torch.randperm(b * cols, device="cuda", generator=g).view(b, cols) + 1
        keys = PagedEntries(pages, index, limit, torch.full((b,), limit, device="cuda"))
        q = torch.randn(b, 1, heads, 128, device="cuda", generator=g).bfloat16()
        weights = torch.randn(b, 1, heads, device="cuda", generator=g)
        row: dict[str, Any] = {
            "case": name,
            "B": b,
            "read_once_us": round(b * limit * 256 / 4.8e6, 1),
        }
        first = None
        for variant, (block_h, block_t, warps, native) in INDEXER_VARIANTS.items():
            indexer.BLOCK_H, indexer.BLOCK_T, indexer.NUM_WARPS = block_h, block_t, warps
            att.QK_NATIVE = native
            row[variant] = graph_us(partial(indexer.paged_indexer_scores, q, keys, weights))
            got = indexer.paged_indexer_scores(q, keys, weights)
            first = got if first is None else first
            row["diff_" + variant] = float((got - first).abs().max())
        print(row, flush=True)
        rows.append(row)
    indexer.BLOCK_H, indexer.BLOCK_T, indexer.NUM_WARPS, att.QK_NATIVE = chosen
    return rows


#: name: (BLOCK, NUM_WARPS, TARGET_PROGRAMS) of the top-k kernel
TOPK_VARIANTS: dict[str, tuple[int, int, int]] = {
    "b2048_w8_p264": (2048, 8, 264),
    "b1024_w4_p264": (1024, 4, 264),
    "b1024_w8_p264": (1024, 8, 264),
    "b2048_w4_p264": (2048, 4, 264),
    "b2048_w8_p132": (2048, 8, 132),
    "b1024_w4_p528": (1024, 4, 528),
    "b1024_w8_p528": (1024, 8, 528),  # the defaults
}


def topk_rows(topk: Any) -> list[dict[str, Any]]:
    from deepinfer.backends.torch_ref import TorchBackend

    reference = TorchBackend("cuda")
    chosen = (topk.BLOCK, topk.NUM_WARPS, topk.TARGET_PROGRAMS)
    rows = []
    for n, entries, k in (
        (1, 8000, 512),
        (32, 8000, 512),
        (1, 32000, 512),
        (32, 32000, 512),
        (128, 32000, 512),
        (32, 4000, 2048),
        (1, 120000, 512),
        (32, 120000, 512),
    ):
        g = torch.Generator(device="cuda").manual_seed(entries)
        scores = torch.randn(n, entries, device="cuda", generator=g).relu() * 3
        n_visible = torch.full((n,), entries - 5, device="cuda")
        pick = partial(reference.topk_picks, scores, k, n_visible=n_visible)
        want = pick()
        row: dict[str, Any] = {"rows": n, "entries": entries, "k": k, "reference": graph_us(pick)}
        for variant, knobs in TOPK_VARIANTS.items():
            topk.BLOCK, topk.NUM_WARPS, topk.TARGET_PROGRAMS = knobs
            pick = partial(topk.stable_topk_picks, scores, k, n_visible=n_visible)
            assert torch.equal(pick(), want), (variant, n, entries, k)
            row[variant] = graph_us(pick)
        print(row, flush=True)
        rows.append(row)
    topk.BLOCK, topk.NUM_WARPS, topk.TARGET_PROGRAMS = chosen
    return rows


def hc_mix_rows(mhc: Any, orig: Any | None) -> list[dict[str, Any]]:
    g = torch.Generator(device="cuda").manual_seed(1)
    chosen, rows = mhc.HC_MIX_SPLIT, []
    for cols in (4096, 16384):
        fn = torch.randn(24, cols, device="cuda", generator=g)
        for n in (1, 32, 128, 4096):
            x = torch.randn(n, 4, cols // 4, device="cuda", generator=g).bfloat16()
            row: dict[str, Any] = {"cols": cols, "rows": n}
            if orig is not None:  # an earlier mhc.py at its own split, and the shipped one
                row["orig_us"] = graph_us(partial(orig.hc_mix, x, fn, 1e-6))
                row["chosen_us"] = graph_us(partial(mhc.hc_mix, x, fn, 1e-6))
                got = mhc.hc_mix(x, fn, 1e-6)
                row["diff_orig"] = float((got - orig.hc_mix(x, fn, 1e-6)).abs().max())
            first = None
            for split in (512, 256, 128, 64):
                mhc.HC_MIX_SPLIT = split
                row[f"split{split}"] = graph_us(partial(mhc.hc_mix, x, fn, 1e-6))
                got = mhc.hc_mix(x, fn, 1e-6)
                first = got if first is None else first
                row[f"diff{split}"] = float((got - first).abs().max())
            print(row, flush=True)
            rows.append(row)
    mhc.HC_MIX_SPLIT = chosen
    return rows


@torch.inference_mode()
def step_rows(att: Any, mhc: Any, variants: list[str], context: int) -> list[dict[str, Any]]:
    from long_context_decode import build

    from deepinfer.cache.slots import StateSlots
    from deepinfer.models.graphs import DecodeGraphs
    from deepinfer.models.layouts import page_table_of
    from deepinfer.models.state_views import clone_state

    rows = []
    for arch in ("v41", "v4"):
        model = build(arch, torch.bfloat16, "cuda", "sm100")
        g = torch.Generator().manual_seed(0)
        prompt = torch.randint(3, 8000, (context,), generator=g).cuda()
        alone = model.new_state(1)
        for start in range(0, context, 4096):
            model.step(prompt[None, start : start + 4096], alone)
        for b in (1, 32):
            slots = StateSlots(
                partial(model.new_state, 1), max_slots=b, max_len=context + 4096, initial_slots=b
            )
            states = [slots.adopt(clone_state(alone)) for _ in range(b)]
            found = page_table_of(states[0])
            if found is not None:  # pages for every timed step now
                for st in states:
                    found[0].ensure(st.layers[0].swa.slot, context + 400)
            ids = torch.randint(3, 8000, (b,), generator=g).cuda()
            for variant in variants:
                for split in (512, 128):
                    use(att, variant)
                    mhc.HC_MIX_SPLIT = split
                    graphs = DecodeGraphs(b)
                    for _ in range(3):  # capture and warm up
                        model(ForwardBatch.decode(ids, states), graphs)
                    times = []
                    for _ in range(20):
                        torch.cuda.synchronize()
                        start = time.perf_counter()
                        model(ForwardBatch.decode(ids, states), graphs)
                        torch.cuda.synchronize()
                        times.append(time.perf_counter() - start)
                    ms = round(statistics.median(times) * 1e3, 3)
                    row = {"arch": arch, "ctx": context, "B": b, "variant": variant}
                    rows.append(row | {"hc_split": split, "step_ms": ms})
                    print(rows[-1], flush=True)
            for st in states:
                slots.release(st)
            del states, slots
        del model
        torch.cuda.empty_cache()
    return rows


def load_module(path: Path | None) -> Any | None:
    """An earlier kernel module (e.g. ``git show REV:<path> > old.py``) to time beside ours."""
    if path is None:
        return None
    spec = importlib.util.spec_from_file_location(f"baseline_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--baseline", type=Path, default=None, help="an earlier attention.py")
    ap.add_argument("--mhc-baseline", type=Path, default=None, help="an earlier mhc.py (hc_mix)")
    ap.add_argument("--steps", nargs="*", default=[], help="variants to time whole steps with")
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), help="attention variants")
    ap.add_argument("--context", type=int, default=32000)
    ap.add_argument("--parts", nargs="+", default=["attention", "hc_mix", "indexer", "topk"])
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("attention_kernels.py times CUDA graphs: it needs an NVIDIA GPU")
    from deepinfer_kernels_sm100 import attention as att
    from deepinfer_kernels_sm100 import indexer, mhc, topk

    orig = load_module(args.baseline)
    chosen = tuple(getattr(att, knob) for knob in KNOBS)
    result: dict[str, Any] = {
        "benchmark": "attention_kernels",
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "variants": VARIANTS,
        "indexer_variants": INDEXER_VARIANTS,
    }
    if "attention" in args.parts:
        result["attention"] = attention_rows(att, orig, args.variants)
    if "hc_mix" in args.parts:
        result["hc_mix"] = hc_mix_rows(mhc, load_module(args.mhc_baseline))
    if "indexer" in args.parts:
        result["indexer"] = indexer_rows(att, indexer)
    if "compress" in args.parts:
        result["compress"] = compress_rows()
    if "topk" in args.parts:
        result["topk"] = topk_rows(topk)
        result["topk_variants"] = TOPK_VARIANTS
    result["step"] = step_rows(att, mhc, args.steps, args.context) if args.steps else []
    use(att, chosen)
    write_result(result, args.out, "attention_kernels_h200")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
