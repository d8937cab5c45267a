"""The mid-size config A of the model reference (~2.12 B parameters) builds and runs on the CPU."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from deepinfer.assets import init_random_weights
from deepinfer.config import ModelConfig
from deepinfer.models.deepseek_v4 import DeepseekV4ForCausalLM


def config_a() -> ModelConfig:
    return ModelConfig(
        vocab_size=129280,
        hidden_size=2048,
        num_hidden_layers=16,
        num_attention_heads=16,
        head_dim=512,
        qk_rope_head_dim=64,
        q_lora_rank=512,
        o_groups=4,
        o_lora_rank=512,
        n_routed_experts=16,
        n_shared_experts=1,
        num_experts_per_tok=4,
        moe_intermediate_size=768,
        num_hash_layers=3,
        index_n_heads=32,
        index_head_dim=128,
        index_topk=512,
        sliding_window=128,
        hc_mult=4,
        compress_ratios=[0, 0] + [4, 128] * 7 + [0],
        num_nextn_predict_layers=1,
    )


def test_parameter_count_is_the_reference_figure() -> None:
    """2.12 B total with 0.26 B embedding, counted (as the reference does) without MTP."""
    model = DeepseekV4ForCausalLM(config_a(), dtype=torch.bfloat16, device="meta")
    main = sum(p.numel() for p in model.parameters()) - sum(
        p.numel() for p in model.mtp.parameters()
    )
    assert main == pytest.approx(2.12e9, rel=0.005), main
    assert model.embed.weight.numel() == pytest.approx(0.26e9, rel=0.03)


@pytest.mark.slow
def test_instantiates_with_random_weights_and_runs_a_forward() -> None:
    """Config A's first four layers (two hash layers of plain attention, then a ratio-4 and a
    ratio-128 compressed layer) at its full widths, vocabulary and MTP layer: every layer kind
    builds, takes random weights and runs a chunked prefill. The other twelve layers repeat
    these shapes and would only multiply the time."""
    cfg = dataclasses.replace(config_a(), num_hidden_layers=4, compress_ratios=[0, 0, 4, 128, 0])
    model = DeepseekV4ForCausalLM(cfg, dtype=torch.bfloat16, device="cpu")
    init_random_weights(model, seed=0)
    ids = torch.randint(3, 129280, (1, 8), generator=torch.Generator().manual_seed(0))
    state = model.new_state(1)
    logits = torch.cat([model.step(ids[:, :5], state), model.step(ids[:, 5:], state)], dim=1)
    assert logits.shape == (1, 8, 129280)
    assert torch.isfinite(logits).all()
