"""Export a transformers ``DeepseekV4ForCausalLM`` under the official DeepSeek checkpoint names.

transformers' ``save_pretrained`` keeps its own names (``model.embed_tokens.weight``,
``self_attn.q_a_proj``, stacked expert tensors), and for the kv norm even writes a wrong reverse
mapping. This tool writes what DeepSeek publishes instead: ``embed.weight``,
``layers.i.attn.wq_a.weight``, ``layers.i.ffn.experts.e.w1.weight``, ``hc_head_fn``, ... in
safetensors shards with a ``model.safetensors.index.json``, plus a ``config.json`` in the
published format (``compress_ratios``, ``num_hash_layers``, ``qk_rope_head_dim``, ``rope_scaling``).

MTP layers are not part of the transformers model; pass them (in transformers' decoder-layer
naming plus the MTP-only tensors) through ``mtp_layers`` to have them written as ``mtp.{i}.*``.
Without them the exported config says ``num_nextn_predict_layers: 0``.

Usage::

    python tools/export_hf.py HF_MODEL_DIR OUT_DIR [--dtype bfloat16] [--max-shard-mb 4096]
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

# transformers names inside one decoder layer -> official names (applied in order, first match).
_LAYER_RULES: list[tuple[str, str]] = [
    (r"^input_layernorm\.", "attn_norm."),
    (r"^post_attention_layernorm\.", "ffn_norm."),
    (r"^attn_hc\.(fn|base|scale)$", r"hc_attn_\1"),
    (r"^ffn_hc\.(fn|base|scale)$", r"hc_ffn_\1"),
    (r"^self_attn\.sinks$", "attn.attn_sink"),
    (r"^self_attn\.q_a_proj\.", "attn.wq_a."),
    (r"^self_attn\.q_a_norm\.", "attn.q_norm."),
    (r"^self_attn\.q_b_proj\.", "attn.wq_b."),
    (r"^self_attn\.kv_proj\.", "attn.wkv."),
    (r"^self_attn\.kv_norm\.", "attn.kv_norm."),
    (r"^self_attn\.o_a_proj\.", "attn.wo_a."),
    (r"^self_attn\.o_b_proj\.", "attn.wo_b."),
    (r"^self_attn\.compressor\.indexer\.kv_proj\.", "attn.indexer.compressor.wkv."),
    (r"^self_attn\.compressor\.indexer\.gate_proj\.", "attn.indexer.compressor.wgate."),
    (r"^self_attn\.compressor\.indexer\.position_bias$", "attn.indexer.compressor.ape"),
    (r"^self_attn\.compressor\.indexer\.kv_norm\.", "attn.indexer.compressor.norm."),
    (r"^self_attn\.compressor\.indexer\.q_b_proj\.", "attn.indexer.wq_b."),
    (r"^self_attn\.compressor\.indexer\.scorer\.weights_proj\.", "attn.indexer.weights_proj."),
    (r"^self_attn\.compressor\.kv_proj\.", "attn.compressor.wkv."),
    (r"^self_attn\.compressor\.gate_proj\.", "attn.compressor.wgate."),
    (r"^self_attn\.compressor\.position_bias$", "attn.compressor.ape"),
    (r"^self_attn\.compressor\.kv_norm\.", "attn.compressor.norm."),
    (r"^mlp\.gate\.weight$", "ffn.gate.weight"),
    (r"^mlp\.gate\.e_score_correction_bias$", "ffn.gate.bias"),
    (r"^mlp\.gate\.tid2eid$", "ffn.gate.tid2eid"),
    (r"^mlp\.shared_experts\.gate_proj\.", "ffn.shared_experts.w1."),
    (r"^mlp\.shared_experts\.up_proj\.", "ffn.shared_experts.w3."),
    (r"^mlp\.shared_experts\.down_proj\.", "ffn.shared_experts.w2."),
]

# MTP-only tensors keep their official names; listed so typos fail loudly.
_MTP_EXTRA = re.compile(
    r"^(enorm|hnorm|norm)\.weight$|^(e_proj|h_proj)\.weight$|^hc_head_(fn|base|scale)$"
)

_TOP_LEVEL = {
    "model.embed_tokens.weight": "embed.weight",
    "lm_head.weight": "head.weight",
    "model.norm.weight": "norm.weight",
    "model.hc_head.hc_fn": "hc_head_fn",
    "model.hc_head.hc_base": "hc_head_base",
    "model.hc_head.hc_scale": "hc_head_scale",
}

# Official tensors that stay fp32 whatever the export dtype (as in the published checkpoints).
_FP32 = re.compile(
    r"(hc_(attn|ffn|head)_(fn|base|scale)|attn_sink|\.ape|ffn\.gate\.bias|norm\.weight)$"
)


def _layer_tensors(prefix: str, state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rename one decoder layer's tensors (transformers naming, no layer prefix)."""
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        if name.endswith("inv_freq"):
            continue  # rotary buffers are derived from the config
        if name == "mlp.experts.gate_up_proj":
            inter = tensor.shape[1] // 2
            for e in range(tensor.shape[0]):
                out[f"{prefix}ffn.experts.{e}.w1.weight"] = tensor[e, :inter]
                out[f"{prefix}ffn.experts.{e}.w3.weight"] = tensor[e, inter:]
            continue
        if name == "mlp.experts.down_proj":
            for e in range(tensor.shape[0]):
                out[f"{prefix}ffn.experts.{e}.w2.weight"] = tensor[e]
            continue
        for pattern, repl in _LAYER_RULES:
            if re.search(pattern, name):
                out[prefix + re.sub(pattern, repl, name)] = tensor
                break
        else:
            if not _MTP_EXTRA.match(name):
                raise KeyError(f"no official name for transformers tensor {prefix}{name}")
            out[prefix + name] = tensor
    return out


def official_state_dict(
    hf_state: Mapping[str, torch.Tensor],
    mtp_layers: list[Mapping[str, torch.Tensor]] | None = None,
) -> dict[str, torch.Tensor]:
    """Map a ``DeepseekV4ForCausalLM`` state dict (and optional MTP layers) to official names."""
    out: dict[str, torch.Tensor] = {}
    per_layer: dict[int, dict[str, torch.Tensor]] = {}
    for name, tensor in hf_state.items():
        if name in _TOP_LEVEL:
            out[_TOP_LEVEL[name]] = tensor
            continue
        m = re.match(r"^model\.layers\.(\d+)\.(.+)$", name)
        if m:
            per_layer.setdefault(int(m.group(1)), {})[m.group(2)] = tensor
        elif not name.endswith("inv_freq"):
            raise KeyError(f"no official name for transformers tensor {name}")
    for i, state in sorted(per_layer.items()):
        out.update(_layer_tensors(f"layers.{i}.", state))
    for i, state in enumerate(mtp_layers or []):
        out.update(_layer_tensors(f"mtp.{i}.", state))
    if "head.weight" not in out:  # tied embeddings
        out["head.weight"] = out["embed.weight"]
    return out


def official_config(hf_config: Any, num_mtp: int = 0) -> dict[str, Any]:
    """The published config.json layout for a transformers ``DeepseekV4Config``."""
    ratios: list[int] = []
    for t in hf_config.layer_types:
        if t == "sliding_attention":
            ratios.append(0)
        else:
            ratios.append(int(hf_config.compress_rates[t]))
    for t, r in zip(hf_config.layer_types, ratios, strict=True):
        if t == "compressed_sparse_attention" and r != 4:
            raise ValueError(
                "the official format marks CSA layers by ratio 4; got CSA ratio " + str(r)
            )
        if t == "heavily_compressed_attention" and r == 4:
            raise ValueError("an HCA ratio of 4 would read back as CSA in the official format")
    mlp_types = list(hf_config.mlp_layer_types)
    num_hash = 0
    while num_hash < len(mlp_types) and mlp_types[num_hash] == "hash_moe":
        num_hash += 1
    rope = hf_config.rope_parameters
    compress = dict(rope["compress"])
    cfg: dict[str, Any] = {
        "architectures": ["DeepseekV4ForCausalLM"],
        "model_type": "deepseek_v4",
        "vocab_size": hf_config.vocab_size,
        "hidden_size": hf_config.hidden_size,
        "num_hidden_layers": hf_config.num_hidden_layers,
        "num_attention_heads": hf_config.num_attention_heads,
        "num_key_value_heads": hf_config.num_key_value_heads,
        "head_dim": hf_config.head_dim,
        "qk_rope_head_dim": int(hf_config.qk_rope_head_dim),
        "q_lora_rank": hf_config.q_lora_rank,
        "o_groups": hf_config.o_groups,
        "o_lora_rank": hf_config.o_lora_rank,
        "moe_intermediate_size": hf_config.moe_intermediate_size,
        "n_routed_experts": hf_config.n_routed_experts,
        "n_shared_experts": hf_config.n_shared_experts,
        "num_experts_per_tok": hf_config.num_experts_per_tok,
        "scoring_func": hf_config.scoring_func,
        "topk_method": "noaux_tc",
        "norm_topk_prob": hf_config.norm_topk_prob,
        "routed_scaling_factor": hf_config.routed_scaling_factor,
        "num_hash_layers": num_hash,
        "swiglu_limit": hf_config.swiglu_limit,
        "hidden_act": hf_config.hidden_act,
        "sliding_window": hf_config.sliding_window,
        "compress_ratios": ratios + [0] * num_mtp,
        "index_n_heads": hf_config.index_n_heads,
        "index_head_dim": hf_config.index_head_dim,
        "index_topk": hf_config.index_topk,
        "hc_mult": hf_config.hc_mult,
        "hc_sinkhorn_iters": hf_config.hc_sinkhorn_iters,
        "hc_eps": hf_config.hc_eps,
        "rope_theta": rope["main"]["rope_theta"],
        "compress_rope_theta": compress["rope_theta"],
        "max_position_embeddings": hf_config.max_position_embeddings,
        "rms_norm_eps": hf_config.rms_norm_eps,
        "num_nextn_predict_layers": num_mtp,
        "tie_word_embeddings": hf_config.tie_word_embeddings,
        "bos_token_id": hf_config.bos_token_id,
        "eos_token_id": hf_config.eos_token_id,
        "torch_dtype": "bfloat16",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "initializer_range": hf_config.initializer_range,
    }
    if compress.get("rope_type", compress.get("type")) == "yarn":
        cfg["rope_scaling"] = {
            "type": "yarn",
            "factor": compress["factor"],
            "original_max_position_embeddings": compress["original_max_position_embeddings"],
            "beta_fast": compress.get("beta_fast", 32),
            "beta_slow": compress.get("beta_slow", 1),
        }
    return cfg


def save_official(
    tensors: Mapping[str, torch.Tensor],
    config: Mapping[str, Any],
    out_dir: str | Path,
    dtype: torch.dtype | None = None,
    max_shard_bytes: int = 4 << 30,
) -> Path:
    """Write shards ``model-0000i-of-0000n.safetensors`` + index + config.json into out_dir."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name in sorted(tensors):
        t = tensors[name].detach().to("cpu")
        if dtype is not None and t.is_floating_point() and not _FP32.search(name):
            t = t.to(dtype)
        t = t.contiguous().clone()  # no shared storage between saved tensors
        nbytes = t.numel() * t.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += nbytes
    weight_map: dict[str, str] = {}
    total = 0
    for i, shard in enumerate(shards):
        file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(out / file), metadata={"format": "pt"})
        for name, t in shard.items():
            weight_map[name] = file
            total += t.numel() * t.element_size()
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    (out / "config.json").write_text(json.dumps(dict(config), indent=2) + "\n")
    return out


def export_model(
    model: Any,
    out_dir: str | Path,
    mtp_layers: list[Mapping[str, torch.Tensor]] | None = None,
    dtype: torch.dtype | None = None,
    max_shard_bytes: int = 4 << 30,
) -> Path:
    """Export an in-memory transformers ``DeepseekV4ForCausalLM`` (and optional MTP layers)."""
    tensors = official_state_dict(model.state_dict(), mtp_layers)
    config = official_config(model.config, num_mtp=len(mtp_layers or []))
    return save_official(tensors, config, out_dir, dtype, max_shard_bytes)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("src", help="a transformers DeepseekV4ForCausalLM directory")
    parser.add_argument("out", help="output directory for the official-name checkpoint")
    parser.add_argument("--dtype", default=None, help="cast weights, e.g. bfloat16 (fp32 stays)")
    parser.add_argument("--max-shard-mb", type=int, default=4096)
    args = parser.parse_args(argv)

    from transformers import DeepseekV4ForCausalLM

    model = DeepseekV4ForCausalLM.from_pretrained(args.src, dtype=torch.float32)
    dtype = getattr(torch, args.dtype) if args.dtype else None
    out = export_model(model, args.out, dtype=dtype, max_shard_bytes=args.max_shard_mb << 20)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
