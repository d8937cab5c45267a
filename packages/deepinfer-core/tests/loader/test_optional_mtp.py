"""Checkpoints without MTP weights load: the main model does not need them.

Other tools re-save checkpoints without the ``mtp.*`` tensors, and some configs omit
``num_nextn_predict_layers``. The embedded tiny model, copied with its MTP tensors removed and/or
the config key dropped, must give the main model exactly the weights stored in the file (read
back with safetensors directly) and the logits of the full checkpoint, and must say that MTP
drafting is unavailable instead of failing somewhere inside it.
"""

from __future__ import annotations

import json
import logging
import shutil
from functools import cache
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from deepinfer.assets import TINY_DIR, load_checkpoint
from deepinfer.errors import DeepInferError
from deepinfer.models import load_model
from deepinfer.models.batch import ForwardBatch
from deepinfer.models.errors import CheckpointError

pytestmark = [
    pytest.mark.skipif(
        not (TINY_DIR / "model.safetensors").is_file(),
        reason="the trained tiny model is not embedded",
    ),
    pytest.mark.usefixtures("one_thread"),
]

IDS = torch.tensor([[0, 311, 45, 1027, 9, 77, 3000, 12, 5, 640, 41, 8000]])


@cache
def stored() -> dict[str, torch.Tensor]:
    """The tiny checkpoint's tensors exactly as stored."""
    return load_file(str(TINY_DIR / "model.safetensors"))


@cache
def full_logits() -> torch.Tensor:
    return load_checkpoint(TINY_DIR, torch.float32, "cpu").forward_logits(IDS)


def _copy(root: Path, *, drop_mtp: bool, drop_key: bool) -> Path:
    """The tiny checkpoint under ``root``, without its MTP tensors and/or the config key."""
    root.mkdir()
    shutil.copy(TINY_DIR / "tokenizer.json", root / "tokenizer.json")
    config = json.loads((TINY_DIR / "config.json").read_text())
    if drop_key:
        del config["text_config"]["num_nextn_predict_layers"]
    (root / "config.json").write_text(json.dumps(config))
    tensors = {k: v for k, v in stored().items() if not (drop_mtp and k.startswith("mtp."))}
    save_file(tensors, str(root / "model.safetensors"))
    return root


@pytest.mark.parametrize("drop_key", [False, True], ids=["declared", "key-omitted"])
def test_checkpoint_without_mtp_tensors_loads_the_main_model(
    tmp_path: Path, drop_key: bool, caplog: pytest.LogCaptureFixture
) -> None:
    assert any(k.startswith("mtp.0.") for k in stored())  # the original does have MTP weights
    root = _copy(tmp_path / "ckpt", drop_mtp=True, drop_key=drop_key)
    with caplog.at_level(logging.INFO, logger="deepinfer"):
        model = load_checkpoint(root, torch.float32, "cpu")
    assert not model.has_mtp and model.cfg.num_nextn_predict_layers == 0
    assert len([r for r in caplog.records if "MTP" in r.getMessage()]) == 1

    # every main-model weight is the stored tensor, read back without DeepInfer's loader
    params = model.state_dict()
    assert set(params) == {k for k in stored() if not k.startswith("mtp.")}
    for name, tensor in params.items():
        assert torch.equal(tensor, stored()[name].to(tensor.dtype)), name

    torch.testing.assert_close(model.forward_logits(IDS), full_logits(), rtol=0, atol=0)

    # what drafting would call says why it cannot, as a DeepInferError
    state = model.new_state(1)
    streams = _streams(model, IDS, state)
    with pytest.raises(CheckpointError, match="no MTP weights"):
        model.mtp_forward(streams, IDS, state)
    with pytest.raises(DeepInferError, match="no MTP weights"):
        model.forward_train_mtp(IDS)


def test_omitted_key_takes_the_count_from_the_tensors(tmp_path: Path) -> None:
    root = _copy(tmp_path / "ckpt", drop_mtp=False, drop_key=True)
    model = load_model(root, dtype=torch.float32)
    assert model.has_mtp and model.cfg.num_nextn_predict_layers == 1
    assert torch.equal(model.mtp[0].e_proj.weight, stored()["mtp.0.e_proj.weight"].float())


def test_partial_mtp_weights_are_still_an_error(tmp_path: Path) -> None:
    """Only a checkpoint with no MTP tensors at all is taken as MTP-less; a damaged one is not."""
    root = _copy(tmp_path / "ckpt", drop_mtp=False, drop_key=False)
    tensors = load_file(str(root / "model.safetensors"))
    del tensors["mtp.0.e_proj.weight"]
    save_file(tensors, str(root / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"missing 1 tensors: mtp\.0\.e_proj\.weight"):
        load_model(root, dtype=torch.float32)


def test_engine_generates_from_a_checkpoint_without_mtp(tmp_path: Path) -> None:
    from deepinfer.llm import LLM
    from deepinfer.sampling_params import SamplingParams

    root = _copy(tmp_path / "ckpt", drop_mtp=True, drop_key=False)
    params = SamplingParams(temperature=0, max_tokens=8)
    outs = [
        LLM(model, device="cpu").generate(["ROMEO:"], params, use_tqdm=False)[0]
        for model in ("tiny", str(root))
    ]
    assert outs[0].outputs[0].token_ids == outs[1].outputs[0].token_ids


def _streams(model, ids: torch.Tensor, state):  # type: ignore[no-untyped-def]
    """The final residual streams [B, S, hc, d] of a step over ``ids`` [B, S]."""
    out = model(ForwardBatch.of(ids, state, return_streams=True))
    return out.streams.unflatten(0, tuple(ids.shape))
