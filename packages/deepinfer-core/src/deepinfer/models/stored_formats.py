"""Which tensors a checkpoint stores in which format, and models that keep them that way.

DeepSeek-V4 checkpoints store attention, shared-expert, MTP-projection and Engram projections as
FP8 e4m3 with block scales, routed experts as FP4 e2m1 (V4-Flash) or FP8, and norms, mHC, sinks
and biases in fp32 (:func:`stored_format`). With ``quantization="auto"`` a model keeps what its
backend computes on (:attr:`~deepinfer.backends.base.Backend.native_formats`) as stored: FP8
projections (:func:`hold_fp8`, half the bytes of bf16 to hold and to read each step) and FP4
routed experts (:func:`hold_fp4`, a quarter), V4.1's Engram tables in FP8 rows
(:func:`hold_fp8_tables`), and the bf16 weights of the projections computed in fp32 (head,
router gates, compressors: :func:`hold_bf16_projections`, half the bytes of fp32). Once the
values are in, :func:`note_fp4_scale_range` tells the FP4 kernels whether every scale is small
enough for their shorter decoding. Shapes the
kernels do not take, and everything on a backend without such kernels (the torch reference),
are dequantised at load as before.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator

import torch
from torch import nn

from deepinfer.backends.fp4_ref import FP4_GROUP
from deepinfer.models.checkpoint_config import QuantSettings
from deepinfer.models.layers.moe import Gate, RoutedExperts
from deepinfer.models.layers.norm import Embedding, Linear

_FP8 = re.compile(
    r"(^|\.)attn\.(wq_a|wq_b|wkv|wo_a|wo_b)\.weight$|indexer\.wq_b\.weight$"
    r"|shared_experts\.w[123]\.weight$|(^|\.)(e_proj|h_proj)\.weight$|engram\.wkv\.weight$"
)
_FP32 = re.compile(r"(^|\.)hc_|norm\.weight$|attn_sink$|\.ape$|\.bias(_vl)?$|[qk]_weight$")


def _fp8_bytes(shape: tuple[int, ...], block: tuple[int, int], scale_bytes: int) -> int:
    """FP8 e4m3 bytes plus one scale per block of the last two dims (ceil at the edges)."""
    *lead, rows, cols = shape
    n = math.prod(lead)
    return n * (rows * cols + math.ceil(rows / block[0]) * math.ceil(cols / block[1]) * scale_bytes)


def _per32_bytes(shape: tuple[int, ...], value_bits: int) -> int:
    """Values of ``value_bits`` bits plus one ue8m0 byte per 32 values along the last dim."""
    *lead, cols = shape
    rows = math.prod(lead)
    return rows * (cols * value_bits // 8 + math.ceil(cols / 32))


def stored_format(name: str, shape: tuple[int, ...], quant: QuantSettings) -> tuple[str, int]:
    """The checkpoint format of one parameter and its bytes in that format (model reference
    §6.1, §5.9)."""
    numel = math.prod(shape)
    if _FP32.search(name):
        return "fp32", 4 * numel
    if quant.quant_method != "fp8":
        return "bf16", 2 * numel
    block = quant.weight_block_size or (128, 128)
    scale = 1 if quant.scale_fmt == "ue8m0" else 4
    label = f"fp8 e4m3 + {'ue8m0' if scale == 1 else 'fp32'} {block[0]}x{block[1]}"
    if ".ffn.experts." in f".{name}":
        if quant.expert_dtype == "fp4":
            return "fp4 e2m1 + ue8m0/32", _per32_bytes(shape, 4)
        return label, _fp8_bytes(shape, block, scale)
    if name.endswith("engram.embed.weight"):
        return "fp8 e4m3 + e8m0/32", _per32_bytes(shape, 8)
    if _FP8.search(name):
        return label, _fp8_bytes(shape, block, scale)
    return "bf16", 2 * numel


#: N and K of an FP8 projection the kernels take (whole 128 x 128 weight tiles).
FP8_DIM_MULTIPLE = 128
#: Values of an FP8 table row per ue8m0 scale (V4.1's Engram tables, model reference §5.9).
TABLE_GROUP = 32


def hold_fp8_tables(model: nn.Module, quant: QuantSettings) -> frozenset[str]:
    """Make V4.1's Engram tables hold their FP8 rows and ue8m0 scales per :data:`TABLE_GROUP`
    values as stored (:meth:`Embedding.hold_fp8_rows`); returns their weight names."""
    if quant.quant_method != "fp8":
        return frozenset()
    kept = []
    for prefix, module in model.named_modules():
        if prefix.endswith("engram.embed") and isinstance(module, Embedding):
            module.hold_fp8_rows(TABLE_GROUP)
            kept.append(f"{prefix}.weight")
    return frozenset(kept)


#: What ``quantization`` may be: keep the stored formats where the backend computes on them,
#: or dequantise every weight at load (None).
QUANTIZATION_CHOICES = ("auto", None)


def stored_as_fp8(name: str, quant: QuantSettings) -> bool:
    """Whether the checkpoint stores the 2-D projection ``name`` as FP8 with block scales."""
    return stored_format(name, (1, 1), quant)[0].startswith("fp8 e4m3 + ") and not (
        name.endswith("engram.embed.weight") or ".ffn.experts." in f".{name}"
    )


def hold_fp8(model: nn.Module, quant: QuantSettings) -> frozenset[str]:
    """Make every FP8-capable projection of ``model`` that the checkpoint stores as FP8 hold
    FP8 weights and fp32 block scales (:meth:`Linear.hold_fp8`); returns their weight names,
    which the loader then yields as stored."""
    if quant.quant_method != "fp8":
        return frozenset()
    block = quant.weight_block_size or (128, 128)
    kept = []
    for prefix, module in model.named_modules():
        if not (isinstance(module, Linear) and module.fp8_capable):
            continue
        name = f"{prefix}.weight"
        n, k = module.weight.shape
        rows = n // module.groups  # a group's rows must be whole blocks and kernel tiles
        if rows % FP8_DIM_MULTIPLE or rows % block[0] or k % FP8_DIM_MULTIPLE:
            continue
        if not stored_as_fp8(name, quant):
            continue
        module.hold_fp8(block)
        kept.append(name)
    return frozenset(kept)


def hold_fp4(model: nn.Module, quant: QuantSettings) -> frozenset[str]:
    """Make the routed experts of ``model`` hold packed FP4 e2m1 codes and ue8m0 scales where
    the checkpoint stores them so (:meth:`RoutedExperts.hold_fp4`); returns the per-expert
    weight names the loader then yields as stored."""
    if quant.expert_dtype != "fp4":
        return frozenset()
    kept = []
    for prefix, module in model.named_modules():
        if not isinstance(module, RoutedExperts):
            continue
        d = module.w13.shape[2]
        if d % FP4_GROUP or module.inter % FP4_GROUP:
            continue
        module.hold_fp4(FP4_GROUP)
        kept += [f"{prefix}.{n}" for n, _ in module.named_views() if n.endswith(".weight")]
    return frozenset(kept)


def fp32_projections(model: nn.Module) -> Iterator[tuple[str, Linear | Gate]]:
    """(name, module) of every projection the reference computes in fp32 from a weight a
    DeepSeek checkpoint stores in bf16: the head, the router gates and the compressors'
    projections (``Linear(..., computes_fp32=True)`` not held in FP8, and ``Gate``)."""
    for prefix, module in model.named_modules():
        if isinstance(module, Gate) or (
            isinstance(module, Linear) and module.computes_fp32 and module.scale is None
        ):
            yield prefix, module


#: An fp32 model feeds these projections fp32 inputs, which a product by a bf16 weight splits
#: into bf16 parts to stay exact (``sm100``'s ``linear_fp32``: about ten small kernels a call
#: where the fp32 weight takes one GEMM). Half the bytes pay for those launches only for large
#: weights (a full-size head): an fp32 model holds in bf16 only weights of at least this many
#: fp32 bytes. A bf16 model's inputs (all but the head's) need no split, so it holds them all.
FP32_INPUT_HOLD_MIN_BYTES = 64 << 20


def hold_bf16_projections(
    model: nn.Module, fp32_input_min_bytes: int = FP32_INPUT_HOLD_MIN_BYTES
) -> frozenset[str]:
    """After the weights are in: hold every projection that is computed in fp32
    (:func:`fp32_projections`) in bf16 where each of its values is exact there, as a DeepSeek
    checkpoint stores them; returns their weight names. The backend's
    :meth:`~deepinfer.backends.base.Backend.linear_fp32` then gives the same fp32 products from
    half the bytes. A weight that is not exact (a checkpoint that stores it in fp32) stays
    fp32, and so does one of an fp32 model under ``fp32_input_min_bytes`` (see
    :data:`FP32_INPUT_HOLD_MIN_BYTES`). On the meta device (memory planning) every one counts as
    exact."""
    fp32_inputs = getattr(model, "dtype", None) == torch.float32
    kept = []
    for prefix, module in fp32_projections(model):
        if fp32_inputs and module.weight.numel() * 4 < fp32_input_min_bytes:
            continue
        if _exact_in_bf16(module.weight):
            module.weight = nn.Parameter(module.weight.to(torch.bfloat16), requires_grad=False)
            kept.append(f"{prefix}.weight")
    return frozenset(kept)


def _exact_in_bf16(weight: torch.Tensor) -> bool:
    if weight.dtype != torch.float32:
        return False
    if weight.device.type == "meta":
        return True
    # by row chunks: a whole-head copy would need gigabytes beside the weights at full size
    return all(torch.equal(rows.to(torch.bfloat16).float(), rows) for rows in weight.split(4096))


#: The largest ue8m0 scale byte (2**1) for which 2**126 times the scale is a normal bf16,
#: which the FP4 kernels can then apply in one product (``Backend.moe_experts_fp4``'s
#: ``scales_fit``).
FP4_FIT_SCALE_BYTE = 128


def note_fp4_scale_range(model: nn.Module) -> None:
    """Record on each routed-expert stack held as FP4 whether every scale byte is at most
    :data:`FP4_FIT_SCALE_BYTE`: one read of the scales once they are loaded (or drawn), so the
    kernels need not check them each call. Stacks on the meta device stay unmarked."""
    for module in model.modules():
        if not isinstance(module, RoutedExperts):
            continue
        scales = [s for s in (module.w13_scale, module.w2_scale) if s is not None]
        if len(scales) != 2 or any(s.is_meta for s in scales):
            continue
        module.scales_fit = all(
            s.numel() == 0 or int(s.view(torch.uint8).max()) <= FP4_FIT_SCALE_BYTE for s in scales
        )
