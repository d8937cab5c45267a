"""What the launch tests share: the torchrun script itself, the checkpoints whose experts fail
one rank's load, and the look for spawned processes left behind.

Run by ``torchrun`` (``python -m torch.distributed.run ... _dp_launch.py OUT MODEL``), every
process builds the same two-rank ``LLM``; only rank 0 gets past it (the others serve, then exit)
and it writes its greedy outputs and the ranks' step counts to ``OUT/rank0.json``. A rank whose
``LLM(...)`` raises writes the error to ``OUT/error<rank>.txt`` first.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from deepinfer import LLM, SamplingParams
from deepinfer.assets import TINY_TOKENIZER, random_tiny_model, tiny_config

#: Small enough that the longer prompts are prefilled in several chunks.
OPTIONS = {"max_num_batched_tokens": 64, "seed": 3}
PROMPTS = [
    [11, 12, 13],
    [20 + i for i in range(40)],
    [300 + (i * 13) % 500 for i in range(150)],
    [42] * 9,
]
GREEDY = SamplingParams(max_tokens=10, temperature=0)
#: Seconds a failing rank above 0 waits for rank 0's error file, so that torchrun, which ends
#: every process once one fails, does not end rank 0 before it has written it.
ERROR_WAIT_S = 30.0


def tokens(outs: list) -> list[list[int]]:
    return [c.token_ids for o in outs for c in o.outputs]


def malformed_checkpoint(path: Path, expert: int) -> Path:
    """A random tiny V4 checkpoint whose routed expert ``expert`` of layer 0 has a malformed
    ``w1``: only the rank that owns that expert reads it (experts 0-3 are rank 0's of two,
    4-7 rank 1's), so only that rank's load fails."""
    path.mkdir(parents=True, exist_ok=True)
    model = random_tiny_model(torch.float32, seed=0)
    tensors = {k: v.contiguous().clone() for k, v in model.state_dict().items()}
    tensors[f"layers.0.ffn.experts.{expert}.w1.weight"] = torch.zeros(3, 3)
    save_file(tensors, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(tiny_config().to_dict()))
    shutil.copy(TINY_TOKENIZER, path / "tokenizer.json")
    return path


def spawned_children() -> list[int]:
    """Process ids of this process's living children started by multiprocessing's spawn
    (its resource tracker, shared by the whole session, is not one of them)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue  # ended meanwhile
        fields = stat[stat.rindex(")") + 2 :].split()  # state, ppid, ...
        if int(fields[1]) == os.getpid() and fields[0] != "Z" and b"spawn_main" in cmdline:
            found.append(int(entry.name))
    return found


def main(out: Path, model: str) -> None:
    rank = int(os.environ["RANK"])
    options = dict(OPTIONS, dtype="float32") if model != "tiny" else OPTIONS
    try:
        llm = LLM(
            model,
            data_parallel_size=int(os.environ["WORLD_SIZE"]),
            enable_expert_parallel=True,
            dp_timeout_s=60,
            **options,
        )
    except Exception as exc:
        (out / f"error{rank}.txt").write_text(f"{type(exc).__name__}: {exc}")
        deadline = time.monotonic() + ERROR_WAIT_S
        while rank > 0 and not (out / "error0.txt").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        raise
    result = {
        "rank": rank,
        "tokens": tokens(llm.generate(PROMPTS, GREEDY, use_tqdm=False)),
        "steps": [m.steps for m in llm.engine.metrics()],
    }
    llm.engine.shutdown()
    (out / f"rank{rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
