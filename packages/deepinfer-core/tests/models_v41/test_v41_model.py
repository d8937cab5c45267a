"""The whole V4.1 text model: against the float64 reference, and chunking invariance."""

from __future__ import annotations

import pytest
import torch
from _tiny import IMAGE_TOKEN, TEXT, VOCAB, tiny_model
from _v41_ref import Reference

from deepinfer.models.batch import ForwardBatch

S = 37


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=0)


def _ids(seed: int, batch: int = 2, length: int = S) -> torch.Tensor:
    return torch.randint(
        0, IMAGE_TOKEN, (batch, length), generator=torch.Generator().manual_seed(seed)
    )


def _run_chunks(model, ids: torch.Tensor, sizes: list[int], images: torch.Tensor | None = None):
    state = model.new_state(ids.shape[0])
    out, i, used = [], 0, 0
    for size in sizes:
        part = ids[:, i : i + size]
        emb = None
        if images is not None:
            n = int((part == IMAGE_TOKEN).sum())
            emb, used = images[used : used + n], used + n
        out.append(model.step(part, state, emb))
        i += size
    assert i == ids.shape[1] and state.pos == i
    return torch.cat(out, dim=1), state


def test_matches_float64_reference(model) -> None:
    ids = _ids(1, batch=1, length=29)
    ours = model.forward_logits(ids)[0].double()
    want = Reference(model.state_dict(), TEXT).logits(ids[0].tolist(), list(range(VOCAB)))
    err = (ours - want).abs().max().item()
    assert err < 1e-4, err


def test_chunking_invariance(model) -> None:
    ids = _ids(2)
    full = model.forward_logits(ids)
    odd, state = _run_chunks(model, ids, [5, 1, 7, 3, 13, 1, 7])
    one, _ = _run_chunks(model, ids, [1] * S)
    assert (odd - full).abs().max().item() < 1e-4
    assert (one - full).abs().max().item() < 1e-4
    # The V4 state fields the engine and prefix cache use are there, with V4.1's layout.
    assert state.layers[2].compressor.num_entries == S // 2  # ratio-2 KV source
    assert state.layers[2].compressor.buf_kv.shape[1] == S % 2
    assert state.layers[5].indexer.num_entries == S  # ratio-1 index keys
    assert state.layers[3].compressor is None and state.layers[3].indexer is None
    assert state.layers[0].swa.length == S
    assert state.token_history.tolist() == ids[:, -2:].tolist()


def test_images_replace_embeddings_at_image_tokens(model) -> None:
    ids = _ids(3, batch=1, length=23)
    ids[0, [4, 5, 6, 15]] = IMAGE_TOKEN
    g = torch.Generator().manual_seed(4)
    images = torch.randn(4, TEXT["hidden_size"], generator=g)
    full = model.forward_logits(ids, image_embeds=images)
    chunked, _ = _run_chunks(model, ids, [5, 1, 11, 6], images)
    assert (chunked - full).abs().max().item() < 1e-4
    rows = {t: images[i] for i, t in enumerate([4, 5, 6, 15])}
    want = Reference(model.state_dict(), TEXT).logits(ids[0].tolist(), list(range(VOCAB)), rows)
    assert (full[0].double() - want).abs().max().item() < 1e-4
    other = model.forward_logits(ids, image_embeds=images * 2)
    assert not torch.allclose(other[0, 4:], full[0, 4:])
    torch.testing.assert_close(other[0, :4], full[0, :4])
    with pytest.raises(ValueError, match="image_embeds"):
        model.forward_logits(ids)
    with pytest.raises(ValueError, match=r"\[4, 64\]"):
        model.forward_logits(ids, image_embeds=images[:3])
    # Batches of several spans take text only, and say so before touching any state.
    state = model.new_state(1)
    with pytest.raises(ValueError, match="images go in a batch of one span"):
        model(ForwardBatch.build([ids[0, :3], ids[0]], [model.new_state(1), state]))
    with pytest.raises(ValueError, match="no image_embeds"):
        model(ForwardBatch.decode(ids[0, 4:5], [state]))
    assert state.pos == 0


def test_every_v41_path_changes_the_logits(model) -> None:
    """Guards against a feature silently switched off: each one moves the logits."""
    ids = _ids(5, batch=1)
    base = model.forward_logits(ids)
    variants = {
        "candidate blocks": tiny_model(seed=0, candidate_topk_blocks=64),
        "index top-k": tiny_model(seed=0, index_topk=64),
    }
    for name, other in variants.items():
        assert not torch.allclose(other.forward_logits(ids), base), name
    m = tiny_model(seed=0)
    m.layers[1].engram.wkv.weight.data.zero_()
    assert not torch.allclose(m.forward_logits(ids), base), "engram"


def test_engram_needs_a_token_map() -> None:
    from _tiny import config

    from deepinfer.config import ModelConfig
    from deepinfer.models import DeepseekV41ForCausalLM

    model = DeepseekV41ForCausalLM(ModelConfig.from_dict(config()), dtype=torch.float32)
    with pytest.raises(ValueError, match="set_engram_token_map"):
        model.forward_logits(_ids(6, batch=1, length=3))
    with pytest.raises(ValueError, match="compressed ids"):
        model.set_engram_token_map(torch.arange(VOCAB) + 1)
    model.set_engram_token_map(torch.arange(50))  # a tokenizer shorter than the embedding
    assert model.engram_token_map[60] == TEXT["engram_pad_token_id"]


def test_mtp_drafting_continues_the_training_forward(model) -> None:
    """The MTP layer fed at decode time (the prompt's streams in two chunks, its ring carried
    between them) gives the logits the training forward computes over the whole sequence at
    once (``forward_train_mtp``: every position, no state), which is what the embedded
    model's MTP layer was trained on."""
    ids = _ids(7, batch=1, length=20)
    with torch.no_grad():
        _, (whole,) = model.forward_train_mtp(ids, with_mtp=True)
    state = model.new_state(1)
    streams = _streams(model, ids, state)
    got = []
    for lo, hi in ((0, 12), (12, 19)):
        logits, _ = model.mtp_forward(streams[:, lo:hi], ids[:, lo + 1 : hi + 1], state)
        got.append(logits)
    assert state.mtp_pos == 19
    torch.testing.assert_close(torch.cat(got, dim=1), whole.detach(), atol=1e-4, rtol=1e-4)


def test_v4_style_residual_switch() -> None:
    """hc_pre_from_prev_sublayer=false gives the V4 residual (with hc_head) and still chunks."""
    model = tiny_model(seed=1, hc_pre_from_prev_sublayer=False)
    assert "hc_head_fn" in model.state_dict()
    ids = _ids(9, batch=1, length=13)
    full = model.forward_logits(ids)
    one, _ = _run_chunks(model, ids, [1] * 13)
    assert (one - full).abs().max().item() < 1e-4


def _streams(model, ids: torch.Tensor, state):  # type: ignore[no-untyped-def]
    """The final residual streams [B, S, hc, d] of a step over ``ids`` [B, S]."""
    out = model(ForwardBatch.of(ids, state, return_streams=True))
    return out.streams.unflatten(0, tuple(ids.shape))
