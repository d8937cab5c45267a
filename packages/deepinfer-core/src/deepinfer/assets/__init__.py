"""Models that ship inside the package, so DeepInfer runs with no download.

``"tiny"`` is a 5.6 M-parameter DeepSeek-V4.1-architecture model trained on Shakespeare
(``assets/tiny``: published config format, official tensor names, model card), loaded through
the normal checkpoint loader. ``random_tiny_model`` is a deterministic random-weight V4 model
with every V4 attention kind (sliding, CSA, HCA), hash and learned routing and an MTP layer,
which the engine tests use as a fast V4 stand-in.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import torch
from tokenizers import Tokenizer

from deepinfer.backends.base import Backend
from deepinfer.config import ModelConfig
from deepinfer.models.causal_lm import DeepseekCausalLM
from deepinfer.models.deepseek_v4 import DeepseekV4ForCausalLM
from deepinfer.models.deepseek_v41 import DeepseekV41ForCausalLM
from deepinfer.models.dummy_weights import SMALL_STD, init_kind
from deepinfer.parallel import ExpertParallel

ASSETS = Path(__file__).resolve().parent
TINY_DIR = ASSETS / "tiny"
TINY_TOKENIZER = TINY_DIR / "tokenizer.json"


def tiny_config() -> ModelConfig:
    return ModelConfig(
        vocab_size=8192,
        hidden_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        head_dim=32,
        qk_rope_head_dim=16,
        q_lora_rank=32,
        o_groups=2,
        o_lora_rank=32,
        moe_intermediate_size=64,
        n_routed_experts=8,
        num_experts_per_tok=2,
        num_hash_layers=1,
        sliding_window=128,
        compress_ratios=[0, 4, 16, 4, 0],
        index_n_heads=16,
        index_head_dim=16,
        index_topk=8,
        hc_mult=4,
        hc_sinkhorn_iters=20,
        num_nextn_predict_layers=1,
        max_position_embeddings=4096,
        bos_token_id=0,
        eos_token_id=1,
    )


def tiny_fp8_config() -> ModelConfig:
    """:func:`tiny_config` with the widths of its FP8 projections multiples of 128, the FP8
    kernels' tile: a model that holds FP8 weights (``quantization="auto"``) in tests."""
    return dataclasses.replace(
        tiny_config(),
        hidden_size=128,
        num_attention_heads=2,
        head_dim=128,
        qk_rope_head_dim=32,
        q_lora_rank=128,
        o_lora_rank=128,
        moe_intermediate_size=128,
        index_n_heads=2,
        index_head_dim=64,
        num_hidden_layers=3,
        compress_ratios=[0, 4, 16, 0],
        attn_kinds=[],  # derived again from the ratios
    )


@torch.no_grad()
def init_random_weights(model: DeepseekCausalLM, seed: int = 0) -> None:
    """Fill every parameter from a seeded generator on the CPU (so every device gets the same
    weights), at the scales of :func:`~deepinfer.models.dummy_weights.init_kind`."""
    g = torch.Generator().manual_seed(seed)
    n_experts = model.cfg.n_routed_experts
    for name, t in model.state_dict(keep_vars=True).items():
        kind = init_kind(name, t)
        if kind == "expert_ids":  # tid2eid: distinct experts per token
            noise = torch.rand(t.shape[0], n_experts, generator=g)
            t.copy_(noise.argsort(dim=-1)[:, : t.shape[1]])
            continue
        if kind == "ones":
            value = torch.ones(t.shape)
        elif kind == "embedding":
            value = torch.randn(t.shape, generator=g)
        elif kind == "projection":
            value = torch.randn(t.shape, generator=g) / math.sqrt(t.shape[1])
            # as a checkpoint stores projections: in the model's dtype, even those the model
            # holds in fp32 (router gate, compressors)
            value = value.to(model.dtype)
        else:  # sinks, ape, mHC fn/base/scale, router bias
            value = torch.randn(t.shape, generator=g) * SMALL_STD
        t.copy_(value.to(t.dtype))


def random_tiny_model(
    dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu", seed: int = 0
) -> DeepseekV4ForCausalLM:
    model = DeepseekV4ForCausalLM(tiny_config(), dtype=dtype, device=device)
    init_random_weights(model, seed)  # drawn on the CPU, so every device gets the same weights
    return model.eval()


def tiny_tokenizer() -> Tokenizer:
    return Tokenizer.from_file(str(TINY_TOKENIZER))


def tiny_model(
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    backend: Backend | None = None,
) -> DeepseekCausalLM:
    """The trained tiny model, read by the public loader like any checkpoint."""
    return load_checkpoint(TINY_DIR, dtype, device, backend)


def load_checkpoint(
    path: Path,
    dtype: torch.dtype,
    device: str | torch.device,
    backend: Backend | None = None,
    *,
    dummy: bool = False,
    tokenizer_path: Path | None = None,
    quantization: str | None = "auto",
    expert_parallel: ExpertParallel | None = None,
) -> DeepseekCausalLM:
    """``load_model`` plus what V4.1 needs beside the weights: Engram's token map, which is a
    function of the tokenizer (``tokenizer_path``, default ``path/tokenizer.json``) and
    therefore not stored in the checkpoint. ``backend``: the op table (default: the torch
    reference on ``device``); ``dummy``: seeded weights from config.json alone, no files read
    (:mod:`deepinfer.models.dummy_weights`); ``quantization``: see
    :func:`~deepinfer.models.load_model`; ``expert_parallel``: hold (read or draw) only
    this rank's shard of the routed experts."""
    from deepinfer.models import load_model
    from deepinfer.models.dummy_weights import dummy_model

    if dummy:
        model = dummy_model(
            path,
            dtype,
            device,
            backend,
            quantization=quantization,
            expert_parallel=expert_parallel,
        )
    else:
        model = load_model(
            path,
            dtype=dtype,
            device=device,
            backend=backend,
            quantization=quantization,
            expert_parallel=expert_parallel,
        )
    if isinstance(model, DeepseekV41ForCausalLM) and model.cfg.engram_layer_ids:
        from deepinfer.models.layers.engram_hash import build_compressed_token_map

        tokenizer = Tokenizer.from_file(str(tokenizer_path or Path(path) / "tokenizer.json"))
        model.set_engram_token_map(build_compressed_token_map(tokenizer))
    return model
