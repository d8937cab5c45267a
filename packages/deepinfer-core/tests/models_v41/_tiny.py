"""The tiny V4.1 config of the model reference (§8.1, "V4.1 tiny extension") and random weights.

8 layers: two SWA-only, three ratio-2 (KV source 2), three ratio-1 (KV source 5); index sources
2, 5 and 7, candidate source 5, so layer 7 picks inside layer 5's candidate blocks and layers 3, 4
and 6 reuse picks; Engram on layer 1; one MTP layer. 16 index heads keep top-k ties away.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from deepinfer.config import ModelConfig
from deepinfer.models import DeepseekV41ForCausalLM

VOCAB = 96
IMAGE_TOKEN = 95

TEXT: dict[str, Any] = {
    "model_type": "deepseek_v41_text",
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "num_hidden_layers": 8,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 32,
    "qk_rope_head_dim": 8,
    "q_lora_rank": 32,
    "o_lora_rank": 16,
    "o_groups": 2,
    "hidden_act": "silu",
    "swiglu_limit": 10.0,
    "rms_norm_eps": 1e-20,
    "rope_theta": 10000,
    "compress_rope_theta": 160000,
    "rope_scaling": {
        "rope_type": "yarn",
        "factor": 16,
        "beta_fast": 32,
        "beta_slow": 1,
        "original_max_position_embeddings": 64,
    },
    "moe_intermediate_size": 32,
    "n_routed_experts": 4,
    "n_shared_experts": 1,
    "num_experts_per_tok": 2,
    "scoring_func": "sqrtsoftplus",
    "topk_method": "noaux_tc",
    "norm_topk_prob": True,
    "routed_scaling_factor": 1.5,
    "sliding_window": 8,
    "compress_ratios": [0, 0, 2, 2, 2, 1, 1, 1, 0],
    "kv_source_layer_ids": [2, 5],
    "index_source_layer_ids": [2, 5, 7],
    "index_n_heads": 16,
    "index_head_dim": 16,
    "index_topk": 4,
    "candidate_source_layer_id": 5,
    "candidate_topk_blocks": 2,
    "candidate_block_size": 4,
    "hc_mult": 4,
    "hc_sinkhorn_iters": 20,
    "hc_eps": 1e-6,
    "engram_layer_ids": [1],
    "engram_num_embeddings": [60],  # primes 11, 13 (bigrams) and 17, 19 (trigrams)
    "engram_max_ngram_size": 3,
    "engram_vocab_size": 11,
    "engram_n_heads": 2,
    "engram_head_dim": 8,
    "engram_pad_token_id": 2,
    "engram_compressed_vocab_size": VOCAB,
    "num_nextn_predict_layers": 1,
}

CONFIG: dict[str, Any] = {
    "architectures": ["DeepseekV41ForCausalLM"],
    "model_type": "deepseek_v41",
    "dtype": "float32",
    "bos_token_id": 0,
    "eos_token_id": 1,
    "pad_token_id": 2,
    "image_token_id": IMAGE_TOKEN,
    "text_config": TEXT,
    "vision_config": {"model_type": "deepseek_v41_vision", "hidden_size": 32},
}


def config(**text: Any) -> dict[str, Any]:
    out = copy.deepcopy(CONFIG)
    out["text_config"].update(text)
    return out


def randomise(model: torch.nn.Module, seed: int = 0) -> None:
    """Random weights at scales that keep every path (sinks, clamps, gates) doing something."""
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if name.endswith(("norm.weight", "q_weight", "k_weight")):
            val = torch.rand(p.shape, generator=g) + 0.5
        elif p.dim() == 1:
            val = torch.randn(p.shape, generator=g) * 0.5
        else:
            val = torch.randn(p.shape, generator=g) * (1.0 / p.shape[-1]) ** 0.5
            if ".experts.0." in name:
                val = val * 8  # make the SwiGLU clamp fire
            if name.endswith("hc_attn_fn") or name.endswith("hc_ffn_fn"):
                val = val * 4
        p.data.copy_(val.to(p.dtype))


def tiny_model(seed: int = 0, **text: Any) -> DeepseekV41ForCausalLM:
    cfg = ModelConfig.from_dict(config(**text))
    model = DeepseekV41ForCausalLM(cfg, dtype=torch.float32)
    randomise(model, seed)
    model.set_engram_token_map(torch.arange(VOCAB))  # identity map (§8.1: tests use one)
    return model.eval()
