"""Train a DSpark drafter for the embedded tiny model on Shakespeare and write its asset folder.

    python tools/train_dspark.py                   # CPU or the GPU if present, then finish
    python tools/train_dspark.py --stage finish    # evaluate .train/dspark.safetensors, write

The target (the embedded tiny model, frozen, fp32) reads random windows of the training plays
and chat examples (``tools/tiny``'s sampler); its chosen layers' outputs are the drafter's
context features and its logits the distillation target (``deepinfer_spec.dspark.training``).
``finish`` measures the acceptance length tau on held-out plays with the real decoding loop
(``dspark_generate``: greedy and at temperature 1), writes the drafter in bf16 with its
config, a model card and the loss curve to ``deepinfer_spec/assets/tiny_dspark``.
Seeded: the same command gives the same weights on the same device type.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

from tiny.data import BatchSampler, TokenizedData, spread_windows, tokenize  # noqa: E402

from deepinfer.assets import tiny_model, tiny_tokenizer  # noqa: E402
from deepinfer.models.causal_lm import DeepseekCausalLM  # noqa: E402
from deepinfer.models.layer_capture import captured_layers, features_of  # noqa: E402
from deepinfer_spec.dspark import DSparkConfig, DSparkDrafter, dspark_generate  # noqa: E402
from deepinfer_spec.dspark.training import block_losses, sample_anchors  # noqa: E402
from deepinfer_spec.dspark.weights import SHIPPED, save_drafter  # noqa: E402

OUT = SHIPPED
WORK = ROOT / ".train"


@dataclass
class TrainConfig:
    steps: int = 600
    batch: int = 4
    seq_len: int = 256
    anchors: int = 32
    lr: float = 1.5e-3
    warmup: int = 30
    clip: float = 1.0
    seed: int = 42
    eval_prompts: int = 6
    eval_tokens: int = 96


@dataclass
class TrainLog:
    config: dict[str, Any]
    device: str
    params: int
    steps: list[int] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)
    ce: list[float] = field(default_factory=list)
    l1: list[float] = field(default_factory=list)
    tau_teacher: list[float] = field(default_factory=list)
    seconds: float = 0.0


def load_data(work: Path, seed: int) -> TokenizedData:
    path = work / "data.pt"
    if path.is_file():
        return TokenizedData.load(path)
    from tiny.corpus import load_corpus

    data = tokenize(load_corpus(), tiny_tokenizer(), seed=seed)
    data.save(path)
    return data


@torch.no_grad()
def target_pass(model: DeepseekCausalLM, ids: torch.Tensor, layers: tuple[int, ...]):
    """(features [B, S, F], logits [B, S, V]) of the frozen target over ``ids`` [B, S]."""
    with captured_layers(model, layers) as seen:
        logits = model.forward_logits(ids)
        return features_of(seen, layers).view(*ids.shape, -1), logits


def lr_at(step: int, tc: TrainConfig) -> float:
    if step < tc.warmup:
        return tc.lr * (step + 1) / tc.warmup
    progress = (step - tc.warmup) / max(1, tc.steps - tc.warmup)
    return tc.lr * 0.5 * (1 + math.cos(math.pi * progress))


def train(tc: TrainConfig, device: torch.device) -> tuple[DSparkDrafter, TrainLog]:
    torch.manual_seed(tc.seed)
    model = tiny_model(torch.float32, device)
    c = DSparkConfig.for_target(model.cfg)
    drafter = DSparkDrafter(c).to(device)
    params = [p for p in drafter.parameters()]
    opt = torch.optim.AdamW(params, lr=tc.lr, weight_decay=0.0)
    sampler = BatchSampler(load_data(WORK, tc.seed), tc.seq_len, seed=tc.seed)
    gen = torch.Generator().manual_seed(tc.seed)
    log = TrainLog(asdict(tc), str(device), sum(p.numel() for p in params))
    start = time.time()
    for step in range(tc.steps):
        ids = sampler.sample(tc.batch)[:, : tc.seq_len].to(device)
        feats, logits = target_pass(model, ids, c.target_layer_ids)
        anchors = sample_anchors(tc.seq_len, c.block_size, tc.anchors, tc.batch, gen).to(device)
        losses = block_losses(
            drafter, feats, ids, logits, anchors, embed=model.embed, head=model.logits
        )
        for group in opt.param_groups:
            group["lr"] = lr_at(step, tc)
        opt.zero_grad(set_to_none=True)
        losses.total.backward()
        torch.nn.utils.clip_grad_norm_(params, tc.clip)
        opt.step()
        log.steps.append(step)
        log.loss.append(float(losses.total))
        log.ce.append(losses.ce)
        log.l1.append(losses.l1)
        log.tau_teacher.append(losses.tau)
        if step % 20 == 0 or step == tc.steps - 1:
            print(
                f"step {step:4d} loss {float(losses.total):.3f} ce {losses.ce:.3f} "
                f"l1 {losses.l1:.3f} tau(teacher) {losses.tau:.2f} "
                f"{time.time() - start:.0f}s",
                flush=True,
            )
    log.seconds = time.time() - start
    return drafter, log


def evaluate(drafter: DSparkDrafter, tc: TrainConfig) -> dict[str, Any]:
    """tau on held-out plays with the real decoding loop, greedy and at temperature 1."""
    model = tiny_model(torch.float32, drafter.fc.weight.device)
    prompts = spread_windows(load_data(WORK, tc.seed).validation.tolist(), tc.eval_prompts, 32)
    out: dict[str, Any] = {"prompts": len(prompts), "tokens_each": tc.eval_tokens}
    for name, temperature in (("greedy", 0.0), ("temperature_1", 1.0)):
        kept, rounds, per = 0, 0, [0] * drafter.c.block_size
        for i, prompt in enumerate(prompts):
            res = dspark_generate(model, drafter, prompt, tc.eval_tokens,
                                  temperature=temperature, seed=i)  # fmt: skip
            kept += sum(res.accepted)
            rounds += len(res.accepted)
            for n in res.accepted:
                for j in range(n):
                    per[j] += 1
        out[name] = {
            "tau": round(1 + kept / rounds, 3),
            "accept_rate_at_k": [round(x / rounds, 3) for x in per],
        }
        print(f"{name}: tau {out[name]['tau']}", flush=True)
    return out


def write(drafter: DSparkDrafter, log: TrainLog, result: dict[str, Any], out: Path) -> None:
    save_drafter(drafter, out)
    (out / "train_log.json").write_text(json.dumps({**asdict(log), "eval": result}) + "\n")
    plot(log, out / "loss_curve.png")
    (out / "README.md").write_text(card(drafter, log, result))


def plot(log: TrainLog, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(9, 3.2))
    ax[0].plot(log.steps, log.loss, lw=0.8, label="total")
    ax[0].plot(log.steps, log.l1, lw=0.8, label="L1 (x0.9)")
    ax[0].set_xlabel("step")
    ax[0].legend()
    ax[1].plot(log.steps, log.tau_teacher, lw=0.8)
    ax[1].set_xlabel("step")
    ax[1].set_ylabel("tau (teacher-forced, T = 1)")
    fig.suptitle("DSpark drafter for the tiny model")
    fig.tight_layout()
    fig.savefig(path, dpi=80)


def card(drafter: DSparkDrafter, log: TrainLog, result: dict[str, Any]) -> str:
    c = drafter.c
    return f"""# DSpark drafter for the embedded tiny model

Trained by `tools/train_dspark.py` ({log.config["steps"]} steps of {log.config["batch"]} x
{log.config["seq_len"]}-token windows, {log.config["anchors"]} anchor blocks each, seed
{log.config["seed"]}, {log.device}, {log.seconds:.0f} s) against the frozen tiny model's
distributions on the Shakespeare training plays and chat examples.

- Block of {c.block_size}; context features from target layers {list(c.target_layer_ids)}
  (all {c.hc_mult} residual streams); {c.num_layers} draft layers of {c.num_heads} x
  {c.head_dim} heads; Markov rank {c.markov_rank}; noise token {c.noise_token_id}.
- {log.params:,} parameters, stored in bf16; the target's embedding and head are shared.

## Acceptance on held-out plays

`dspark_generate`, {result["prompts"]} prompts of 32 tokens from the validation plays,
{result["tokens_each"]} tokens each, every draft verified:

| decoding | tau | accept rate at k |
|---|---|---|
| greedy | {result["greedy"]["tau"]} | {result["greedy"]["accept_rate_at_k"]} |
| temperature 1 | {result["temperature_1"]["tau"]} | {result["temperature_1"]["accept_rate_at_k"]} |

![loss](loss_curve.png)
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--stage", choices=["all", "finish"], default="all")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", type=Path, default=OUT)
    for f in TrainConfig.__dataclass_fields__.values():
        ap.add_argument(f"--{f.name.replace('_', '-')}", type=type(f.default), default=f.default)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    tc = TrainConfig(**{k: getattr(args, k) for k in TrainConfig.__dataclass_fields__})
    device = torch.device(args.device)
    WORK.mkdir(exist_ok=True)
    if args.stage == "all":
        drafter, log = train(tc, device)
        from safetensors.torch import save_file

        save_file(dict(drafter.state_dict()), str(WORK / "dspark.safetensors"))
        drafter.c.to_json(WORK / "dspark_config.json")
        (WORK / "dspark_log.json").write_text(json.dumps(asdict(log)) + "\n")
    else:
        from safetensors.torch import load_file

        drafter = DSparkDrafter(DSparkConfig.from_json(WORK / "dspark_config.json")).to(device)
        drafter.load_state_dict(load_file(str(WORK / "dspark.safetensors")))
        log = TrainLog(**json.loads((WORK / "dspark_log.json").read_text()))
    drafter.eval()
    result = evaluate(drafter, tc)
    write(drafter, log, result, args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
