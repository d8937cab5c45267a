"""The tiny V4.1 model's config and initialisation.

Every V4.1 text feature is present at tiny scale: eight layers with ratio-2 and ratio-1 shared
compressors (KV sources 2 and 5), index sources 2, 5 and 7 with layer 5 publishing candidate
blocks, the lagged mHC pre-mix, Engram on layer 1, hash-free MoE routing with a shared expert,
and one MTP layer. The vocabulary is the tokenizer's (8192), so the embedding and the fp32 head
are a large share of the parameters.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from tokenizers import Tokenizer

from deepinfer.config import ModelConfig
from deepinfer.models import DeepseekV41ForCausalLM
from deepinfer.models.layers.engram import engram_vocab_sizes
from deepinfer.models.layers.engram_hash import build_compressed_token_map, table_primes

#: Engram hash-table size base (primes are searched upwards from it, per n-gram size and head).
ENGRAM_TABLE_BASE = 2003


def tiny_text_config(tokenizer: Tokenizer) -> dict[str, Any]:
    """The ``text_config`` of the tiny model; Engram sizes follow from the tokenizer."""
    token_map = build_compressed_token_map(tokenizer)
    text: dict[str, Any] = {
        "model_type": "deepseek_v41_text",
        "vocab_size": tokenizer.get_vocab_size(),
        "hidden_size": 128,
        "num_hidden_layers": 8,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 64,
        "qk_rope_head_dim": 16,
        "q_lora_rank": 64,
        "o_groups": 2,
        "o_lora_rank": 64,
        "hidden_act": "silu",
        "swiglu_limit": 10.0,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "compress_rope_theta": 160000.0,
        "rope_scaling": {
            "rope_type": "yarn",
            "factor": 16,
            "beta_fast": 32,
            "beta_slow": 1,
            "original_max_position_embeddings": 256,
        },
        "max_position_embeddings": 4096,
        "moe_intermediate_size": 128,
        "n_routed_experts": 4,
        "n_shared_experts": 1,
        "num_experts_per_tok": 2,
        "scoring_func": "sqrtsoftplus",
        "topk_method": "noaux_tc",
        "norm_topk_prob": True,
        "routed_scaling_factor": 1.5,
        "num_hash_layers": 0,
        "sliding_window": 64,
        "compress_ratios": [0, 0, 2, 2, 2, 1, 1, 1, 0],
        "kv_source_layer_ids": [2, 5],
        "index_source_layer_ids": [2, 5, 7],
        "index_n_heads": 16,
        "index_head_dim": 16,
        "index_topk": 16,
        "candidate_source_layer_id": 5,
        "candidate_topk_blocks": 4,
        "candidate_block_size": 8,
        "hc_mult": 4,
        "hc_sinkhorn_iters": 20,
        "hc_eps": 1e-6,
        "hc_pre_from_prev_sublayer": True,
        "q_head_norm": False,
        "engram_layer_ids": [1],
        "engram_max_ngram_size": 3,
        "engram_vocab_size": ENGRAM_TABLE_BASE,
        "engram_n_heads": 2,
        "engram_head_dim": 32,
        "engram_pad_token_id": tokenizer.token_to_id("<｜▁pad▁｜>"),
        "engram_compressed_vocab_size": int(token_map.max()) + 1,
        "num_nextn_predict_layers": 1,
    }
    probe = ModelConfig.from_dict({"model_type": "deepseek_v41", "text_config": dict(text)})
    primes = table_primes(probe.engram_layer_ids, engram_vocab_sizes(probe), probe.engram_n_heads)
    text["engram_num_embeddings"] = [
        sum(sum(heads) for heads in primes[layer]) for layer in probe.engram_layer_ids
    ]
    return text


def tiny_config(tokenizer: Tokenizer, dtype: str = "bfloat16") -> ModelConfig:
    """The full (published-format) V4.1 config; ``dtype`` is the stored weight dtype."""
    image = tokenizer.token_to_id("<｜image｜>")
    return ModelConfig.from_dict(
        {
            "architectures": ["DeepseekV41ForCausalLM"],
            "model_type": "deepseek_v41",
            "dtype": dtype,
            "bos_token_id": tokenizer.token_to_id("<｜begin▁of▁sentence｜>"),
            "eos_token_id": tokenizer.token_to_id("<｜end▁of▁sentence｜>"),
            "pad_token_id": tokenizer.token_to_id("<｜▁pad▁｜>"),
            "image_token_id": image,
            "text_config": tiny_text_config(tokenizer),
        }
    )


#: Output projections of a residual branch: scaled down with depth (GPT-2 style) so the
#: residual streams start close to the embedding and grow as training finds uses for them.
_OUTPUT_PROJECTIONS = ("attn.wo_b.weight", ".w2.weight")


@torch.no_grad()
def init_weights(model: DeepseekV41ForCausalLM, seed: int) -> None:
    """Seeded initialisation (parameters are created uninitialised).

    Projections draw N(0, 0.02), residual output projections N(0, 0.02 / sqrt(2 * layers)),
    norms and Engram gate weights start at 1, sinks and router biases at 0. mHC starts as a
    plain residual: ``fn`` small, ``pre`` = 1/n per stream, ``post`` = 1 and ``comb`` close to
    the identity (a large diagonal logit before Sinkhorn).
    """
    g = torch.Generator().manual_seed(seed)
    n = model.cfg.hc_mult
    depth = 2 * (model.cfg.num_hidden_layers + model.cfg.num_nextn_predict_layers)
    for name, p in model.named_parameters():
        leaf = name.rsplit(".", 1)[-1]
        if leaf.startswith("hc_") or "_hc_" in name or ".hc_" in name:
            value = _init_hc(name, p.shape, n, g)
        elif "norm" in name or leaf in ("q_weight", "k_weight"):
            value = torch.ones(p.shape)
        elif leaf in ("attn_sink", "bias", "bias_vl"):
            value = torch.zeros(p.shape)
        else:
            std = 0.02
            if name.endswith(_OUTPUT_PROJECTIONS):
                std /= math.sqrt(depth)
            value = torch.randn(p.shape, generator=g) * std
        p.copy_(value.to(p.dtype))


def _init_hc(name: str, shape: torch.Size, n: int, g: torch.Generator) -> torch.Tensor:
    if name.endswith("_fn"):
        return torch.randn(shape, generator=g) * 0.01
    if name.endswith("_scale"):
        return torch.ones(shape)
    # _base: [pre (n), post (n), comb (n*n)] for a sublayer, [pre (n)] for a head.
    pre = torch.full((n,), math.log(1 / (n - 1)))  # sigmoid -> 1/n
    if shape[0] == n:
        return pre
    post = torch.zeros(n)  # 2 * sigmoid(0) = 1
    comb = torch.eye(n).flatten() * 4.0
    return torch.cat((pre, post, comb))
