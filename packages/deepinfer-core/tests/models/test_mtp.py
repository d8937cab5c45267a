"""The MTP layer against transformers modules composed by hand.

transformers drops ``mtp.*``, but an MTP layer is a sliding-window V4 decoder layer plus a few
norms and projections, so the reference is built from transformers' own decoder layer, hyper
head and RMSNorm with the MTP weights, and the MTP-only tensors are exported next to the model.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from _v4_oracle import build_hf, load_export_tool
from torch import Tensor

from deepinfer.models import DeepseekV4ForCausalLM, load_model
from deepinfer.models.batch import ForwardBatch

TOL = 1e-4
SEQ = 40
MTP_SOURCE_LAYER = 5  # a sliding-window, learned-routing layer of the tiny config


class MTPOracle:
    def __init__(self, seed: int) -> None:
        self.main = build_hf(seed)
        donor = build_hf(seed + 17)  # a second model supplies independent MTP weights
        self.layer = donor.model.layers[MTP_SOURCE_LAYER]
        self.hc_head = donor.model.hc_head
        self.norm = donor.model.norm
        self.rotary = donor.model.rotary_emb
        g = torch.Generator().manual_seed(seed + 23)
        d = self.main.config.hidden_size
        self.extra = {
            "enorm.weight": 1 + 0.1 * torch.randn(d, generator=g),
            "hnorm.weight": 1 + 0.1 * torch.randn(d, generator=g),
            "e_proj.weight": torch.randn(d, d, generator=g) * d**-0.5,
            "h_proj.weight": torch.randn(d, d, generator=g) * d**-0.5,
        }

    def mtp_state(self) -> dict[str, Tensor]:
        """The MTP layer's tensors in transformers' decoder-layer naming, for the exporter."""
        state = dict(self.layer.state_dict())
        state.update(self.extra)
        state["norm.weight"] = self.norm.weight.detach()
        state["hc_head_fn"] = self.hc_head.hc_fn.detach()
        state["hc_head_base"] = self.hc_head.hc_base.detach()
        state["hc_head_scale"] = self.hc_head.hc_scale.detach()
        return state

    def streams(self, ids: Tensor) -> Tensor:
        """The main model's residual streams right before its hc_head."""
        captured: list[Tensor] = []
        hook = self.main.model.hc_head.register_forward_pre_hook(
            lambda _m, args: captured.append(args[0])
        )
        try:
            with torch.no_grad():
                self.main(ids)
        finally:
            hook.remove()
        return captured[0]

    @torch.no_grad()
    def logits(self, streams: Tensor, next_ids: Tensor) -> Tensor:
        eps = self.main.config.rms_norm_eps

        def rms(x: Tensor, w: Tensor) -> Tensor:
            return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

        e = self.main.model.embed_tokens(next_ids)
        e = F.linear(rms(e, self.extra["enorm.weight"]), self.extra["e_proj.weight"])
        h = F.linear(rms(streams, self.extra["hnorm.weight"]), self.extra["h_proj.weight"])
        x = e[:, :, None] + h
        s = x.shape[1]
        pos = torch.arange(s)[None]
        window = self.main.config.sliding_window
        delta = pos[0][:, None] - pos[0][None, :]
        mask = torch.where((delta >= 0) & (delta < window), 0.0, float("-inf"))[None, None]
        emb = {k: self.rotary(x, position_ids=pos, layer_type=k) for k in ("main", "compress")}
        x = self.layer(
            x, input_ids=next_ids, position_embeddings=emb, position_ids=pos, attention_mask=mask
        )
        return self.main.lm_head(self.norm(self.hc_head(x)))


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[MTPOracle, DeepseekV4ForCausalLM]:
    torch.set_num_threads(1)
    oracle = MTPOracle(seed=11)
    out: Path = tmp_path_factory.mktemp("mtp")
    load_export_tool().export_model(oracle.main, out, mtp_layers=[oracle.mtp_state()])
    return oracle, load_model(out, dtype=torch.float32, device="cpu")


def test_mtp_matches_composed_reference(setup: tuple[MTPOracle, DeepseekV4ForCausalLM]) -> None:
    oracle, ours = setup
    gen = torch.Generator().manual_seed(4)
    ids = torch.randint(0, oracle.main.config.vocab_size, (2, SEQ + 1), generator=gen)
    state = ours.new_state(2)
    streams = _streams(ours, ids[:, :SEQ], state)
    ref_streams = oracle.streams(ids[:, :SEQ])
    # The streams grow to ~50 over the layers: fp32 rounding alone reaches 1e-4 there.
    torch.testing.assert_close(streams, ref_streams, rtol=1e-5, atol=TOL)
    got, _ = ours.mtp_forward(streams, ids[:, 1 : SEQ + 1], state)
    ref = oracle.logits(ref_streams, ids[:, 1 : SEQ + 1])
    err = (got - ref).abs().max().item()
    assert err < TOL, f"max abs diff {err:.3g}"
    assert state.mtp_pos == SEQ


def test_mtp_chunked_equals_reference(setup: tuple[MTPOracle, DeepseekV4ForCausalLM]) -> None:
    oracle, ours = setup
    gen = torch.Generator().manual_seed(5)
    ids = torch.randint(0, oracle.main.config.vocab_size, (1, SEQ + 1), generator=gen)
    ref = oracle.logits(oracle.streams(ids[:, :SEQ]), ids[:, 1 : SEQ + 1])
    state = ours.new_state(1)
    outs, pos = [], 0
    for n in (7, 1, 1, 20, 11):
        streams = _streams(ours, ids[:, pos : pos + n], state)
        logits, _ = ours.mtp_forward(streams, ids[:, pos + 1 : pos + n + 1], state)
        outs.append(logits)
        pos += n
    err = (torch.cat(outs, dim=1) - ref).abs().max().item()
    assert err < TOL, f"max abs diff {err:.3g}"


def _streams(model, ids: torch.Tensor, state):  # type: ignore[no-untyped-def]
    """The final residual streams [B, S, hc, d] of a step over ``ids`` [B, S]."""
    out = model(ForwardBatch.of(ids, state, return_streams=True))
    return out.streams.unflatten(0, tuple(ids.shape))
