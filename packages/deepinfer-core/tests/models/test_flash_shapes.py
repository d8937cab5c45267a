"""The published V4-Flash config builds (on the meta device) with the published tensor shapes."""

from __future__ import annotations

import pytest
import torch
from _published import FLASH

from deepinfer.config import ModelConfig
from deepinfer.models import DeepseekV4ForCausalLM


@pytest.fixture(scope="module")
def flash() -> DeepseekV4ForCausalLM:
    return DeepseekV4ForCausalLM(ModelConfig.from_dict(FLASH), device="meta")


@pytest.fixture(scope="module")
def tensors(flash: DeepseekV4ForCausalLM) -> dict[str, torch.Tensor]:
    return flash.expected_tensors()


def test_parameter_count_matches_transformers(flash: DeepseekV4ForCausalLM) -> None:
    # docs/model-deepseek-v4.md §2.4, counted on transformers' model (no MTP, no router bias).
    published = (
        277_025_390_592  # routed experts
        + 4_599_123_136  # attention core
        + 1_082_130_432  # shared experts
        + 2 * 529_530_880  # embed + head
        + 261_464_576  # CSA + HCA compressors
        + 225_730_176  # CSA indexers
        + 45_088_768  # router weights
        + 33_884_439  # mHC
        + 356_352  # norms
    )
    router_bias = 40 * 256  # learned-routing layers 3..42
    main = sum(p.numel() for n, p in flash.named_parameters() if not n.startswith("mtp."))
    assert main == published + router_bias


@pytest.mark.parametrize(
    ("name", "shape"),
    [
        ("embed.weight", (129280, 4096)),
        ("head.weight", (129280, 4096)),
        ("hc_head_fn", (4, 16384)),
        ("hc_head_scale", (1,)),
        ("layers.0.hc_attn_fn", (24, 16384)),
        ("layers.0.hc_ffn_scale", (3,)),
        ("layers.0.attn.wq_a.weight", (1024, 4096)),
        ("layers.0.attn.wq_b.weight", (32768, 1024)),
        ("layers.0.attn.wkv.weight", (512, 4096)),
        ("layers.0.attn.wo_a.weight", (8192, 4096)),
        ("layers.0.attn.wo_b.weight", (4096, 8192)),
        ("layers.0.attn.attn_sink", (64,)),
        ("layers.0.ffn.gate.tid2eid", (129280, 6)),
        ("layers.2.attn.compressor.wkv.weight", (1024, 4096)),
        ("layers.2.attn.compressor.ape", (4, 1024)),
        ("layers.3.attn.compressor.wgate.weight", (512, 4096)),
        ("layers.3.attn.compressor.ape", (128, 512)),
        ("layers.3.attn.compressor.norm.weight", (512,)),
        ("layers.2.attn.indexer.compressor.wkv.weight", (256, 4096)),
        ("layers.2.attn.indexer.compressor.ape", (4, 256)),
        ("layers.2.attn.indexer.compressor.norm.weight", (128,)),
        ("layers.2.attn.indexer.wq_b.weight", (8192, 1024)),
        ("layers.2.attn.indexer.weights_proj.weight", (64, 4096)),
        ("layers.3.ffn.gate.bias", (256,)),
        ("layers.42.ffn.experts.255.w1.weight", (2048, 4096)),
        ("layers.42.ffn.experts.255.w2.weight", (4096, 2048)),
        ("layers.42.ffn.shared_experts.w3.weight", (2048, 4096)),
        ("mtp.0.e_proj.weight", (4096, 4096)),
        ("mtp.0.hc_head_base", (4,)),
        ("mtp.0.attn.wkv.weight", (512, 4096)),
        ("mtp.0.ffn.gate.bias", (256,)),
    ],
)
def test_published_shapes(
    tensors: dict[str, torch.Tensor], name: str, shape: tuple[int, ...]
) -> None:
    assert tuple(tensors[name].shape) == shape


def test_layer_kinds_and_fp32_parameters(tensors: dict[str, torch.Tensor]) -> None:
    sliding = ("layers.0.attn.compressor", "layers.1.attn.compressor", "mtp.0.attn.compressor")
    assert not any(n.startswith(sliding) for n in tensors)
    assert not any(n.startswith("layers.3.attn.indexer") for n in tensors)
    for name in (
        "hc_head_fn",
        "layers.5.attn.attn_sink",
        "layers.2.attn.compressor.ape",
        "norm.weight",
    ):
        assert tensors[name].dtype == torch.float32
    assert tensors["layers.2.attn.wq_a.weight"].dtype == torch.bfloat16
