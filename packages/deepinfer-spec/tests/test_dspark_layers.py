"""The DSpark drafter's pieces against float64 recomputations of ``dspark.md`` §3's formulas:

* RoPE rotates each (a, b) pair of halves by position x theta^(-i / half), the rotation shared
  by every layer of a pass;
* the RMS norm (torch's fused kernel on a GPU, the composite on a CPU);
* a round's greedy drafts follow the Markov chain left to right, and every slot's confidence
  is sigmoid(w [h_k ; E1[x_{k-1}]] + b) with x_0 the anchor, however the round batches them.
"""

from __future__ import annotations

import pytest
import torch

from deepinfer_spec.dspark import DSparkConfig, DSparkDrafter
from deepinfer_spec.dspark.batch import draft_block
from deepinfer_spec.dspark.model import RMSNorm, rope, rotation

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
def test_rope_rotates_each_pair_of_halves(device: str) -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 7, 4, 32, generator=gen).to(device)
    positions = torch.randint(0, 5000, (3, 7), generator=gen).to(device)
    got = rope(x, rotation(positions, 32, 10000.0)).double().cpu()
    x64, pos64 = x.double().cpu(), positions.double().cpu()
    freq = 10000.0 ** (-torch.arange(16, dtype=torch.float64) / 16)
    angle = (pos64[..., None] * freq)[..., None, :]
    a, b = x64[..., :16], x64[..., 16:]
    want = torch.cat((a * angle.cos() - b * angle.sin(), b * angle.cos() + a * angle.sin()), -1)
    # the angles are taken in fp32 (as trained): their rounding at positions near 5,000 bounds
    # the error
    torch.testing.assert_close(got, want, rtol=0, atol=5e-3 * x64.abs().max().item())
    near = (positions < 64).cpu()
    torch.testing.assert_close(got[near], want[near], rtol=0, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm(device: str, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(1)
    norm = RMSNorm(96, 1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(96, generator=gen))
    norm = norm.to(device, dtype)
    x = (torch.randn(5, 96, generator=gen) * 3).to(device, dtype)
    got = norm(x)
    x64, w64 = x.double(), norm.weight.double()
    want = x64 / (x64.pow(2).mean(-1, keepdim=True) + 1e-6).sqrt() * w64
    assert got.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 1e-2  # bf16: one rounding of the output
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol)


def test_round_drafts_follow_the_markov_chain_and_confidences_their_formula() -> None:
    torch.manual_seed(0)
    c = DSparkConfig(vocab_size=97, hidden_size=32, hc_mult=2, target_layer_ids=(0,),
                     noise_token_id=2, num_heads=2, head_dim=16, intermediate_size=48,
                     markov_rank=8, sliding_window=16)  # fmt: skip
    drafter = DSparkDrafter(c).eval()
    embed_table = torch.randn(c.vocab_size, c.hidden_size)
    head_w = torch.randn(c.vocab_size, c.hidden_size)
    rows, ctx = 3, 6
    context = [
        (torch.randn(rows, ctx, c.num_heads, c.head_dim), torch.randn(rows, ctx, 2, 16))
        for _ in range(c.num_layers)
    ]
    mask = torch.ones(rows, c.block_size, ctx + c.block_size, dtype=torch.bool)
    anchors, starts = torch.tensor([5, 40, 90]), torch.tensor([ctx] * rows)
    with torch.no_grad():
        tokens, conf = draft_block(
            drafter, context, mask, anchors, starts, embed_table.__getitem__,
            lambda h: (h @ head_w.T).float(),
        )  # fmt: skip
        positions = starts[:, None] + torch.arange(c.block_size)
        block = drafter.block_input(anchors, embed_table.__getitem__)
        h = drafter.backbone(block, positions, context, mask).double()
    e1 = drafter.markov_embed.weight.detach().double()
    w2 = drafter.markov_out.weight.detach().double()
    wc, bc = drafter.confidence.weight.detach().double()[0], drafter.confidence.bias.double()
    for r in range(rows):
        prev = int(anchors[r])
        for k in range(c.block_size):
            logits = h[r, k] @ head_w.double().T + w2 @ e1[prev]
            want_conf = torch.sigmoid(wc @ torch.cat((h[r, k], e1[prev])) + bc)
            torch.testing.assert_close(conf[r, k].double(), want_conf[0], rtol=1e-5, atol=1e-6)
            assert int(tokens[r, k]) == int(logits.argmax())
            prev = int(tokens[r, k])
