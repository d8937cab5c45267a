"""Tiny transformers DeepSeek-V4 oracles with every V4 feature switched on.

transformers is the independent reference: we build its model, give the parameters it leaves at
zero real values, export it under the official names with tools/export_hf.py and load that.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[4]


def load_export_tool() -> Any:
    """tools/export_hf.py is a script, not a package: import it by path."""
    name = "deepinfer_tools_export_hf"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, REPO / "tools" / "export_hf.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


TINY: dict[str, Any] = {
    "vocab_size": 512,
    "hidden_size": 128,
    "num_hidden_layers": 6,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 64,
    "qk_rope_head_dim": 16,
    "q_lora_rank": 64,
    "o_groups": 2,
    "o_lora_rank": 32,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "n_shared_experts": 1,
    "moe_intermediate_size": 64,
    "scoring_func": "sqrtsoftplus",
    "routed_scaling_factor": 1.5,
    "num_hash_layers": 2,
    "swiglu_limit": 10.0,
    "sliding_window": 16,
    "index_n_heads": 16,
    "index_head_dim": 32,
    "index_topk": 8,
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
    "num_nextn_predict_layers": 1,
    "layer_types": [
        "sliding_attention",
        "compressed_sparse_attention",
        "heavily_compressed_attention",
        "compressed_sparse_attention",
        "heavily_compressed_attention",
        "sliding_attention",
    ],
    "compress_rates": {"compressed_sparse_attention": 4, "heavily_compressed_attention": 16},
}


def hf_config(**overrides: Any) -> Any:
    from transformers import DeepseekV4Config

    kwargs = {**TINY, **overrides}
    return DeepseekV4Config(**kwargs)


@torch.no_grad()
def randomise(model: Any, seed: int, clamp_scale: float = 40.0) -> None:
    """Give the parameters transformers leaves at zero real values, and make the clamp fire."""
    g = torch.Generator().manual_seed(seed)
    cfg = model.config
    for name, p in model.named_parameters():
        if name.endswith("sinks"):
            p.copy_(torch.randn(p.shape, generator=g))
        elif name.endswith("position_bias") or name.endswith(
            ("attn_hc.base", "ffn_hc.base", "hc_head.hc_base")
        ):
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
        elif name.endswith(("attn_hc.scale", "ffn_hc.scale", "hc_head.hc_scale")):
            p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))
        elif name.endswith("norm.weight") or name.endswith("layernorm.weight"):
            p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
        elif name.endswith("experts.gate_up_proj"):
            # Large gate/up pre-activations so min(gate, limit) and clamp(up) actually clip.
            p.mul_(clamp_scale)
    for name, b in model.named_buffers():
        if name.endswith("e_score_correction_bias"):
            b.copy_(torch.randn(b.shape, generator=g) * 0.3)
        elif name.endswith("tid2eid"):
            # Distinct experts per token, as a real table has.
            rows = [
                torch.randperm(cfg.n_routed_experts, generator=g)[: b.shape[1]]
                for _ in range(b.shape[0])
            ]
            b.copy_(torch.stack(rows))


def build_hf(seed: int = 0, **overrides: Any) -> Any:
    from transformers import DeepseekV4ForCausalLM

    torch.manual_seed(seed)
    model = DeepseekV4ForCausalLM(hf_config(**overrides)).eval()
    randomise(model, seed + 1)
    return model
