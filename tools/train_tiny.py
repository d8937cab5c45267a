"""Train the embedded tiny DeepSeek-V4.1 model on Shakespeare and write its asset folder.

    python tools/train_tiny.py                      # all stages, CPU or the GPU if present
    python tools/train_tiny.py --stage prepare      # corpus -> token streams (.train/data.pt)
    python tools/train_tiny.py --stage train        # -> .train/checkpoint.safetensors + log
    python tools/train_tiny.py --stage finish       # -> assets/tiny: config, weights, card, PNG

Stages exist so the (slow) training can run on another machine from the prepared token file
alone; ``finish`` evaluates the held-out plays, samples text and writes the model card.

The defaults are the embedded model's run (one GPU, about four minutes). On two CPU threads the
reference ops train at roughly 1,300 tokens/s, so a CPU run uses smaller batches:
``--device cpu --threads 2 --batch 16 --warmup 50 --steps 700`` (about 40 minutes) passes
2.4 bits per character on the held-out sample after about 150 steps.
Seeded: the same command gives the same weights on the same device type (CPU runs are
bit-reproducible; CUDA scatter-adds may differ in the last bits).

Training runs the model's own forward (``forward_train_mtp``), so the trained weights are
exactly what inference computes with. What gets no gradient: top-k choices (expert routing,
indexer picks). Router biases follow the auxiliary-loss-free rule (nudged towards equal expert
load after every step); the indexer projections keep their seeded values, since a sparse top-k
pick passes no gradient and this recipe has no indexer distillation loss.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "packages" / "deepinfer-core" / "src"))

from tiny.data import BatchSampler, TokenizedData, tokenize, validation_windows  # noqa: E402
from tiny.model import init_weights, tiny_config  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

from deepinfer.backends.torch_ref import TorchBackend  # noqa: E402
from deepinfer.models import DeepseekV41ForCausalLM, load_model  # noqa: E402
from deepinfer.models.layers.engram_hash import build_compressed_token_map  # noqa: E402

ASSETS = ROOT / "packages" / "deepinfer-core" / "src" / "deepinfer" / "assets" / "tiny"
WORK = ROOT / ".train"
SAMPLE_PROMPTS = ("ROMEO:", "KING HENRY.\n", "To be, or not to be")
CHAT_PROMPT = "FIRST CITIZEN.\nWhat say you to the king?"


@dataclass
class TrainConfig:
    seed: int = 0
    steps: int = 800
    batch: int = 64
    seq_len: int = 256
    lr: float = 2e-3
    min_lr_ratio: float = 0.1
    warmup: int = 100
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    mtp_weight: float = 0.3
    chat_fraction: float = 0.2
    router_bias_rate: float = 1e-3
    eval_every: int = 100
    eval_windows: int = 64


# -- routing statistics for the auxiliary-loss-free router bias -----------------------------------


class CountingBackend(TorchBackend):
    """The reference ops, counting how many tokens each biased router sends to each expert."""

    def __init__(self, device: torch.device) -> None:
        super().__init__(device)
        self.loads: dict[int, Tensor] = {}

    def moe_route(  # type: ignore[override]
        self, x: Tensor, gate_weight: Tensor, bias: Tensor | None, **kw: Any
    ) -> tuple[Tensor, Tensor]:
        weights, indices = super().moe_route(x, gate_weight, bias, **kw)
        if bias is not None:
            counts = torch.bincount(indices.flatten(), minlength=bias.numel()).float()
            self.loads[id(bias)] = self.loads.get(id(bias), 0) + counts
        return weights, indices


@torch.no_grad()
def update_router_biases(model: DeepseekV41ForCausalLM, ops: CountingBackend, rate: float) -> None:
    """``bias += rate * sign(mean load - load)`` per router (DeepSeek-V3's balancing rule)."""
    for module in model.modules():
        bias = getattr(module, "bias", None)
        if isinstance(bias, torch.nn.Parameter) and id(bias) in ops.loads:
            load = ops.loads[id(bias)]
            bias.add_(rate * torch.sign(load.mean() - load))
    ops.loads.clear()


# -- model ----------------------------------------------------------------------------------------


def build_model(tok: Tokenizer, seed: int, device: torch.device) -> DeepseekV41ForCausalLM:
    cfg = tiny_config(tok)
    ops = CountingBackend(device)
    model = DeepseekV41ForCausalLM(cfg, dtype=torch.float32, device=device, backend=ops)
    init_weights(model, seed)  # drawn on the CPU, so every device starts from the same weights
    model.set_engram_token_map(build_compressed_token_map(tok))
    return model


def trainable(model: torch.nn.Module) -> tuple[list[Tensor], list[Tensor]]:
    """(decayed matrices, undecayed vectors); router biases are set by the balancing rule."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if name.endswith((".gate.bias", ".gate.bias_vl")):
            continue
        p.requires_grad_(True)
        (decay if p.dim() >= 2 else no_decay).append(p)
    return decay, no_decay


def lm_losses(model: DeepseekV41ForCausalLM, batch: Tensor) -> tuple[Tensor, Tensor | None]:
    """(next-token loss, MTP loss) in nats per token, -100 targets ignored."""
    inputs, targets = batch[:, :-1], batch[:, 1:]
    pad = model.cfg.pad_token_id or 0
    logits, mtp = model.forward_train_mtp(torch.where(inputs < 0, pad, inputs), with_mtp=True)
    vocab = logits.shape[-1]
    loss = F.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1), ignore_index=-100)
    mtp_loss = None
    if mtp:
        # depth 0, row t predicts token t + 2 = targets[:, t + 1]
        m = mtp[0][:, : targets.shape[1] - 1]
        mtp_loss = F.cross_entropy(
            m.reshape(-1, vocab), targets[:, 1:].reshape(-1), ignore_index=-100
        )
    return loss, mtp_loss


@torch.no_grad()
def validation_nats(
    model: DeepseekV41ForCausalLM, windows: Tensor, batch: int = 32
) -> tuple[float, int]:
    """(total nats, number of predicted tokens) over validation windows, inference path."""
    total, count = 0.0, 0
    pad = model.cfg.pad_token_id or 0
    for i in range(0, windows.shape[0], batch):
        w = windows[i : i + batch].to(model.device)
        inputs, targets = torch.where(w[:, :-1] < 0, pad, w[:, :-1]), w[:, 1:]
        logits = model.forward_logits(inputs)
        nats = F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]),
            targets.reshape(-1),
            ignore_index=-100,
            reduction="sum",
        )
        total += float(nats)
        count += int((targets >= 0).sum())
    return total, count


# -- stages ---------------------------------------------------------------------------------------


def prepare(tok: Tokenizer, data_path: Path, seed: int) -> TokenizedData:
    from tiny.corpus import load_corpus

    t0 = time.time()
    data = tokenize(load_corpus(), tok, seed=seed)
    data.save(data_path)
    print(
        f"prepared {data_path}: {data.train.numel():,} train tokens, {data.chat.numel():,} chat "
        f"tokens ({data.chat_starts.numel():,} exchanges), {data.validation.numel():,} validation "
        f"tokens / {data.validation_chars:,} characters in {time.time() - t0:.0f}s"
    )
    return data


@dataclass
class TrainLog:
    config: dict[str, Any]
    device: str
    params: int
    steps: list[int] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)
    mtp_loss: list[float] = field(default_factory=list)
    eval_steps: list[int] = field(default_factory=list)
    eval_bpc: list[float] = field(default_factory=list)
    best_step: int = -1
    seconds: float = 0.0
    tokens_per_second: float = 0.0


def command_for(tc: TrainConfig) -> str:
    """The command that reproduces a run: every option that differs from the defaults."""
    defaults = asdict(TrainConfig())
    opts = [f"--{k.replace('_', '-')} {v}" for k, v in asdict(tc).items() if v != defaults[k]]
    return " ".join(["python tools/train_tiny.py", *opts])


def lr_at(step: int, tc: TrainConfig) -> float:
    if step < tc.warmup:
        return tc.lr * (step + 1) / tc.warmup
    progress = (step - tc.warmup) / max(1, tc.steps - tc.warmup)
    cosine = 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return tc.lr * (tc.min_lr_ratio + (1 - tc.min_lr_ratio) * cosine)


def train(
    tok: Tokenizer, data: TokenizedData, tc: TrainConfig, device: torch.device, work: Path
) -> TrainLog:
    """Train; keep the weights with the best held-out score (evaluated every ``eval_every``)."""
    from safetensors.torch import save_file

    torch.manual_seed(tc.seed)
    model = build_model(tok, tc.seed, device)
    decay, no_decay = trainable(model)
    opt = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": tc.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=tc.lr,
        betas=(0.9, 0.95),
        eps=1e-8,
    )
    sampler = BatchSampler(data, tc.seq_len, tc.chat_fraction, tc.seed)
    windows = validation_windows(data, tc.seq_len)
    pick = torch.randperm(windows.shape[0], generator=torch.Generator().manual_seed(tc.seed))
    eval_windows = windows[pick[: tc.eval_windows]]
    chars_per_token = data.validation_chars / (data.validation.numel() - 1)
    n_params = sum(p.numel() for p in model.parameters())
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    log = TrainLog(asdict(tc), f"{device} ({name})", n_params)
    shape = f"{tc.batch}x{tc.seq_len}"
    print(f"training {n_params:,} parameters on {device} for {tc.steps} steps of {shape}")
    best = float("inf")
    t0 = time.time()
    for step in range(tc.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, tc)
        batch = sampler.sample(tc.batch).to(device)
        loss, mtp_loss = lm_losses(model, batch)
        total = loss if mtp_loss is None else loss + tc.mtp_weight * mtp_loss
        opt.zero_grad(set_to_none=True)
        total.backward()
        torch.nn.utils.clip_grad_norm_(decay + no_decay, tc.grad_clip)
        opt.step()
        assert isinstance(model.ops, CountingBackend)
        update_router_biases(model, model.ops, tc.router_bias_rate)
        log.steps.append(step)
        log.loss.append(loss.item())
        log.mtp_loss.append(mtp_loss.item() if mtp_loss is not None else float("nan"))
        if (step + 1) % tc.eval_every == 0 or step + 1 == tc.steps:
            nats, count = validation_nats(model, eval_windows)
            model.ops.loads.clear()  # evaluation routing must not steer the biases
            bpc = nats / count / math.log(2) / chars_per_token
            log.eval_steps.append(step + 1)
            log.eval_bpc.append(bpc)
            elapsed = time.time() - t0
            print(
                f"step {step + 1:5d}  loss {loss.item():.3f}  mtp {log.mtp_loss[-1]:.3f}  "
                f"val bpc~{bpc:.3f}  lr {lr_at(step, tc):.2e}  {elapsed:.0f}s",
                flush=True,
            )
            if bpc < best:
                best = bpc
                log.best_step = step + 1
                state = {
                    k: v.detach().float().cpu().contiguous() for k, v in model.state_dict().items()
                }
                save_file(state, str(work / "checkpoint.safetensors"))
    log.seconds = time.time() - t0
    log.tokens_per_second = tc.steps * tc.batch * tc.seq_len / log.seconds
    (work / "train_log.json").write_text(json.dumps(asdict(log)))
    speed = f"{log.tokens_per_second:,.0f} tokens/s"
    print(f"done in {log.seconds:.0f}s ({speed}); best step {log.best_step}")
    return log


def export(tok: Tokenizer, work: Path, out: Path) -> None:
    """Write config.json and model.safetensors (bf16 projections, fp32 where the model keeps
    fp32) in the official format, so ``load_model(out)`` reads them like any checkpoint."""
    from safetensors.torch import load_file, save_file

    cfg = tiny_config(tok, dtype="bfloat16")
    model = DeepseekV41ForCausalLM(cfg, dtype=torch.bfloat16)
    model.load_state(load_file(str(work / "checkpoint.safetensors")).items())
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2) + "\n")
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "model.safetensors").chmod(0o644)  # a package asset, readable by everyone


def load_tiny(out: Path, tok: Tokenizer) -> DeepseekV41ForCausalLM:
    model = load_model(out, dtype=torch.float32)
    assert isinstance(model, DeepseekV41ForCausalLM)
    model.set_engram_token_map(build_compressed_token_map(tok))
    return model


@torch.no_grad()
def sample(
    model: DeepseekV41ForCausalLM,
    ids: list[int],
    *,
    n: int,
    seed: int,
    temperature: float = 0.8,
    stop: int | None = None,
) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    state = model.new_state(1)
    logits = model.step(torch.tensor([ids]), state)[0, -1]
    out: list[int] = []
    for _ in range(n):
        probs = torch.softmax(logits / temperature, dim=-1)
        nxt = int(torch.multinomial(probs, 1, generator=g))
        if nxt == stop:
            break
        out.append(nxt)
        logits = model.step(torch.tensor([[nxt]]), state)[0, -1]
    return out


def finish(tok: Tokenizer, data: TokenizedData, work: Path, out: Path) -> None:
    export(tok, work, out)
    if (ASSETS / "tokenizer.json").resolve() != (out / "tokenizer.json").resolve():
        shutil.copy(ASSETS / "tokenizer.json", out / "tokenizer.json")
    model = load_tiny(out, tok)
    log = json.loads((work / "train_log.json").read_text())
    t0 = time.time()
    nats, count = validation_nats(model, validation_windows(data, log["config"]["seq_len"]))
    bpc = nats / math.log(2) / data.validation_chars
    took = time.time() - t0
    print(
        f"validation: {count:,} tokens, {data.validation_chars:,} chars, "
        f"bpc {bpc:.4f} ({took:.0f}s)"
    )
    samples = {}
    for i, prompt in enumerate(SAMPLE_PROMPTS):
        ids = tok.encode(prompt, add_special_tokens=False).ids
        samples[prompt] = prompt + tok.decode(sample(model, ids, n=120, seed=i))
    chat_ids = [
        tok.token_to_id("<｜begin▁of▁sentence｜>"),
        tok.token_to_id("<｜User｜>"),
        *tok.encode(CHAT_PROMPT, add_special_tokens=False).ids,
        tok.token_to_id("<｜Assistant｜>"),
        tok.token_to_id("</think>"),
    ]
    reply = tok.decode(
        sample(model, chat_ids, n=150, seed=7, stop=tok.token_to_id("<｜end▁of▁sentence｜>"))
    )
    for prompt, text in samples.items():
        print(f"--- {prompt!r}\n{text}")
    print(f"--- chat: {CHAT_PROMPT!r}\n{reply}")
    result = {
        "validation_bpc": bpc,
        "validation_tokens": count,
        "validation_chars": data.validation_chars,
        "samples": samples,
        "chat_prompt": CHAT_PROMPT,
        "chat_reply": reply,
    }
    (work / "finish.json").write_text(json.dumps(result, indent=2))
    plot(log, out / "loss_curve.png")
    from tiny.card import write_card

    command = command_for(TrainConfig(**log["config"]))
    write_card(
        out / "README.md",
        model=model,
        log=log,
        result=result,
        sdist_sha256=data.sdist_sha256,
        command=command,
    )
    size = sum(f.stat().st_size for f in out.iterdir() if f.is_file())
    print(f"wrote {out} ({size / 1e6:.1f} MB)")


def _running_mean(values: list[float], k: int = 20) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64)
    if t.numel() <= k:
        return t.tolist()
    return F.avg_pool1d(t[None, None], k, 1).flatten().tolist()


def plot(log: dict[str, Any], path: Path) -> None:
    """Training losses (nats/token) beside the held-out score (bits/character)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.6))
    for key, label in (("loss", "next token"), ("mtp_loss", "MTP (token t+2)")):
        smooth = _running_mean(log[key])
        left.plot(log["steps"][: len(smooth)], smooth, label=label)
    left.set(xlabel="step", ylabel="train loss, nats/token (20-step mean)", ylim=(2, 9.5))
    left.legend()
    right.plot(log["eval_steps"], log["eval_bpc"], "o-", label="held-out plays (sample)")
    right.axhline(2.4, color="grey", ls="--", lw=0.8, label="acceptance bound 2.4")
    right.set(xlabel="step", ylabel="bits per character", ylim=(1.5, 3.0))
    right.legend()
    fig.suptitle("tiny DeepSeek-V4.1 on Shakespeare")
    fig.tight_layout()
    fig.savefig(path, dpi=80)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--stage", choices=("all", "prepare", "train", "finish"), default="all")
    p.add_argument("--device", default="auto", help="auto (cuda if present), cpu or cuda")
    p.add_argument("--work", type=Path, default=WORK, help="token file, checkpoint and log")
    p.add_argument("--out", type=Path, default=ASSETS, help="the asset folder to write")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    defaults = TrainConfig()
    for f in TrainConfig.__dataclass_fields__.values():
        p.add_argument(
            f"--{f.name.replace('_', '-')}",
            type=type(getattr(defaults, f.name)),
            default=getattr(defaults, f.name),
        )
    args = p.parse_args(argv)
    tc = TrainConfig(**{f: getattr(args, f) for f in TrainConfig.__dataclass_fields__})
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(
        "cuda"
        if args.device == "auto" and torch.cuda.is_available()
        else ("cpu" if args.device == "auto" else args.device)
    )
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False  # keep fp32 maths, like the CPU
    tok = Tokenizer.from_file(str(ASSETS / "tokenizer.json"))
    args.work.mkdir(parents=True, exist_ok=True)
    data_path = args.work / "data.pt"
    if args.stage in ("all", "prepare"):
        data = prepare(tok, data_path, tc.seed)
    else:
        data = TokenizedData.load(data_path)
    if args.stage in ("all", "train"):
        train(tok, data, tc, device, args.work)
    if args.stage in ("all", "finish"):
        finish(tok, data, args.work, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
