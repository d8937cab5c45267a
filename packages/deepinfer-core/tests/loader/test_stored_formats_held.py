"""``quantization="auto"``: FP8 projections and FP4 routed experts stay as stored.

A tiny V4 model with every width a multiple of 128 is written as a checkpoint in the published
formats (FP8 projections with ue8m0 block scales, FP4 experts with ue8m0 scales per 32). Loaded
for a backend that computes on those formats, its plain projections and its experts hold the
stored bytes; the reference ``fp8_linear`` (activations quantised per token and 128 columns) is
checked against a float64 emulation built from this directory's independent decoders, the FP4
experts against the dequantised ones (exact: every e2m1 value times its scale is an fp32), and
the model's logits against the same model dequantised, within a bound derived below.
"""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np
import torch

from deepinfer.assets import init_random_weights, tiny_fp8_config
from deepinfer.backends.torch_ref import TorchBackend
from deepinfer.models import load_model
from deepinfer.models.deepseek_v4 import DeepseekV4ForCausalLM
from deepinfer.models.layers.moe import RoutedExperts
from deepinfer.models.layers.norm import Linear
from deepinfer.models.quant import quant_fp4_e2m1, quant_fp8_block

#: The projections a V4 checkpoint stores as FP8 (model reference §6.1).
FP8 = re.compile(
    r"attn\.(wq_a|wq_b|wkv|wo_a|wo_b)\.weight$|indexer\.wq_b\.weight$"
    r"|shared_experts\.w[123]\.weight$|(e_proj|h_proj)\.weight$"
)
#: Held as FP8 by the model: all but Engram's (this model has none).
HELD = FP8
FP4 = re.compile(r"ffn\.experts\.\d+\.w[123]\.weight$")
BLOCK = (128, 128)


class NativeTorch(TorchBackend):
    """The torch reference, keeping the stored formats: its ``fp8_linear`` and
    ``moe_experts_fp4`` run."""

    native_formats = frozenset({"fp8", "fp4_experts"})


class Fp4Torch(TorchBackend):
    """The torch reference, keeping FP4 experts only."""

    native_formats = frozenset({"fp4_experts"})


def _nearest_e4m3(v: np.ndarray, ref: Any) -> np.ndarray:
    """``v`` rounded to the nearest finite e4m3 value, ties to the even code (float64)."""
    codes = np.arange(127)  # the non-negative finite codes, ascending in value
    values = ref.e4m3_to_f64(codes)
    mag = np.minimum(np.abs(v), values[-1])
    hi = np.clip(np.searchsorted(values, mag), 1, 126)
    lo = hi - 1
    d_lo, d_hi = mag - values[lo], values[hi] - mag
    pick = np.where(d_lo < d_hi, lo, np.where(d_hi < d_lo, hi, np.where(lo % 2 == 0, lo, hi)))
    return np.sign(v) * values[pick]


class Float64Fp8(NativeTorch):
    """``fp8_linear`` recomputed in float64 from the stored bytes and the conftest decoders."""

    def __init__(self, ref: Any) -> None:
        super().__init__("cpu")
        self.ref = ref

    def fp8_linear(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        scale: torch.Tensor,
        block: tuple[int, int],
        x_fp8: Any = None,
    ) -> torch.Tensor:
        """Quantises ``x`` here, independently, whatever codes the norm handed over."""
        w = self.ref.fp8_block(weight, scale, block)  # [N, K] float64
        a = x.float().numpy().reshape(-1, x.shape[-1])
        groups = a.reshape(a.shape[0], -1, 128)
        # The scheme's two fp32 operations, amax / 448 and x / scale, in IEEE fp32 as the
        # kernels do; the rounding to e4m3 and everything after it in float64.
        amax = np.abs(groups).max(axis=-1, keepdims=True)
        s = np.where(amax > 0, amax / np.float32(448.0), np.float32(1.0)).astype(np.float32)
        q = _nearest_e4m3((groups / s).astype(np.float64), self.ref) * s.astype(np.float64)
        y = q.reshape(a.shape) @ w.T
        return torch.from_numpy(y).reshape(*x.shape[:-1], -1).to(x.dtype)


def _stored_checkpoint(checkpoint: Any) -> tuple[Any, DeepseekV4ForCausalLM]:
    """(the checkpoint's path, the float model it was quantised from)."""
    cfg = tiny_fp8_config()
    source = DeepseekV4ForCausalLM(cfg, dtype=torch.float32)
    init_random_weights(source, seed=7)
    stored: dict[str, torch.Tensor] = {}
    for name, tensor in source.state_dict().items():
        if FP8.search(name):
            q, s = quant_fp8_block(tensor, BLOCK, "ue8m0")
            stored[name], stored[name.replace(".weight", ".scale")] = q, s
        elif FP4.search(name):
            q, s = quant_fp4_e2m1(tensor)
            stored[name], stored[name.replace(".weight", ".scale")] = q, s
        else:
            stored[name] = tensor
    raw = cfg.to_dict() | {
        "quantization_config": {
            "quant_method": "fp8",
            "fmt": "e4m3",
            "scale_fmt": "ue8m0",
            "weight_block_size": list(BLOCK),
        },
        "expert_dtype": "fp4",
    }
    return checkpoint([stored], raw), source


def _ids() -> torch.Tensor:
    return torch.randint(3, 8000, (2, 150), generator=torch.Generator().manual_seed(1))


def test_plain_fp8_projections_hold_the_stored_bytes(checkpoint: Any, ref: Any) -> None:
    path, _ = _stored_checkpoint(checkpoint)
    held = load_model(path, dtype=torch.float32, backend=NativeTorch("cpu"))
    plain = load_model(path, dtype=torch.float32, backend=NativeTorch("cpu"), quantization=None)
    stored = dict(_read(path))
    kept = 0
    for prefix, module in held.named_modules():
        if not isinstance(module, Linear):
            continue
        name = f"{prefix}.weight"
        if HELD.search(name):
            assert module.weight.dtype == torch.float8_e4m3fn and module.scale is not None, name
            assert torch.equal(module.weight.view(torch.uint8), stored[name].view(torch.uint8))
            want = ref.ue8m0_to_f64(ref.raw_bytes(stored[name.replace(".weight", ".scale")]))
            assert np.array_equal(module.scale.double().numpy(), want), name
            kept += 1
        else:
            assert module.weight.dtype != torch.float8_e4m3fn, name
    # (3 layers + the MTP layer) x (5 attention + 3 shared expert), one indexer, e/h_proj
    assert kept == 4 * (5 + 3) + 1 + 2
    experts = [m for m in held.modules() if isinstance(m, RoutedExperts)]
    assert len(experts) == 4
    for prefix, module in held.named_modules():
        if isinstance(module, RoutedExperts):
            assert module.w13.dtype == torch.uint8 and module.w13_scale is not None
            for e in range(module.w13.shape[0]):
                for name, view in module.views(e).items():
                    want_bytes = stored[f"{prefix}.{e}.{name}"].view(torch.uint8)
                    assert torch.equal(view, want_bytes), f"{prefix}.{e}.{name}"
    assert all(p.is_floating_point() and p.element_size() > 1 for p in plain.parameters())
    # The torch reference computes nothing in FP8: "auto" dequantises for it.
    reference = load_model(path, dtype=torch.float32)
    assert all(p.is_floating_point() and p.element_size() > 1 for p in reference.parameters())


def _read(path: Any) -> list[tuple[str, torch.Tensor]]:
    from safetensors.torch import load_file

    return [kv for f in sorted(path.glob("*.safetensors")) for kv in load_file(f).items()]


def test_reference_fp8_linear_equals_float64_emulation(checkpoint: Any, ref: Any) -> None:
    """Every held projection of the loaded model, on activations of mixed magnitudes (an
    all-zero row among them): the torch reference's ``fp8_linear`` equals the float64
    emulation up to its fp32 summation, K x 2**-23 of the sum of the products' magnitudes."""
    path, _ = _stored_checkpoint(checkpoint)
    model = load_model(path, dtype=torch.float32, backend=NativeTorch("cpu"))
    emulation = Float64Fp8(ref)
    g = torch.Generator().manual_seed(3)
    checked = 0
    for module in model.modules():
        if not isinstance(module, Linear) or module.scale is None:
            continue
        k = module.weight.shape[1]
        x = torch.randn(6, k, generator=g) * torch.tensor([1, 1e-3, 30, 0, 1, 5])[:, None]
        x[4, :7] = 200.0  # an outlier group: its other values lose precision
        got = model.ops.fp8_linear(x, module.weight, module.scale, module.block).double()
        want = emulation.fp8_linear(x.double(), module.weight, module.scale, module.block)
        w = torch.from_numpy(np.abs(ref.fp8_block(module.weight, module.scale, module.block)))
        bound = k * 2**-23 * (x.double().abs() * 1.07) @ w.T  # |q| <= |x| (1 + 2**-4)
        assert ((got - want).abs() <= bound + 1e-30).all()
        assert torch.equal(got[3], torch.zeros_like(got[3]))
        if module.groups > 1:  # the grouped form: group j through rows j of the weight
            xg = torch.randn(5, module.groups, k, generator=g)
            got = model.ops.fp8_grouped_linear(xg, module.weight, module.scale, module.block)
            rows = module.weight.shape[0] // module.groups
            for j in range(module.groups):
                part = slice(j * rows, (j + 1) * rows)
                blocks = slice(j * rows // BLOCK[0], (j + 1) * rows // BLOCK[0])
                want = emulation.fp8_linear(
                    xg[:, j].double(), module.weight[part], module.scale[blocks], module.block
                )
                torch.testing.assert_close(got[:, j].double(), want, rtol=1e-5, atol=1e-5)
        checked += 1
    assert checked == 4 * (5 + 3) + 1 + 2


def test_fp8_model_is_the_dequantised_model_within_activation_rounding(checkpoint: Any) -> None:
    """Bound: e4m3 keeps 3 mantissa bits, so quantising an activation moves it by at most
    2**-4 of itself, and by 2**-4 / sqrt(3) in RMS for a uniformly placed value. A projection's
    output then moves by that RMS fraction too (a sum of independent perturbations), and the
    errors of the L quantised projections along a token's path add in quadrature: the logits'
    relative RMS error stays below 3 x 2**-4 / sqrt(3) x sqrt(L) (a factor 3 of margin for
    the residual and normalisation paths, which neither damp nor amplify it on average)."""
    path, _ = _stored_checkpoint(checkpoint)
    held = load_model(path, dtype=torch.float32, backend=NativeTorch("cpu"))
    plain = load_model(path, dtype=torch.float32, quantization=None)
    got, want = held.forward_logits(_ids()), plain.forward_logits(_ids())
    rel = ((got - want).square().mean() / want.square().mean()).sqrt().item()
    depth = 4 * 3  # the held projections a token crosses: 4 a layer (its indexer in parallel)
    assert 0 < rel <= 3 * 2**-4 / math.sqrt(3) * math.sqrt(depth)


def test_fp4_experts_equal_the_dequantised_experts(checkpoint: Any) -> None:
    """Decoded FP4 weights are exact in fp32, so experts held as stored give the dequantised
    model's logits up to the order of fp32 sums (the FP8 projections dequantised in both)."""
    path, _ = _stored_checkpoint(checkpoint)
    held = load_model(path, dtype=torch.float32, backend=Fp4Torch("cpu"))
    assert any(isinstance(m, RoutedExperts) and m.w13_scale is not None for m in held.modules())
    plain = load_model(path, dtype=torch.float32, quantization=None)
    torch.testing.assert_close(
        held.forward_logits(_ids()), plain.forward_logits(_ids()), rtol=1e-5, atol=1e-5
    )
