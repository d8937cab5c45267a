"""Each V4.1-only component against the float64 re-implementation in ``_v41_ref`` (from the spec).

Inputs are fed in odd-sized chunks wherever the component keeps state, so these tests also check
that a chunk boundary (inside a ratio-2 pair, inside an n-gram) changes nothing.
"""

from __future__ import annotations

import re
import unicodedata

import pytest
import torch
from _tiny import TEXT, tiny_model
from _v41_ref import (
    F64,
    Reference,
    engram_apply,
    engram_multipliers,
    engram_primes,
    engram_rows,
    hc_post,
    mhc_weights,
    top_ids,
)

from deepinfer.backends.torch_ref import TorchBackend
from deepinfer.models.layers.candidate_indexer import SharedKV, candidate_blocks, pick_topk
from deepinfer.models.layers.engram_hash import (
    build_compressed_token_map,
    hash_multipliers,
    table_primes,
)
from deepinfer.models.layers.lagged_mhc import LaggedHyperConnection

CHUNKS = (3, 1, 4, 1, 5, 9, 2, 6)  # 31 rows, boundaries at odd and even offsets
S = sum(CHUNKS)


def _chunks(x: torch.Tensor) -> list[torch.Tensor]:
    out, i = [], 0
    for c in CHUNKS:
        out.append(x[:, i : i + c])
        i += c
    return out


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=3)


@pytest.fixture(scope="module")
def ref(model):
    return Reference(model.state_dict(), TEXT)


def _x(seed: int, d: int = TEXT["hidden_size"]) -> torch.Tensor:
    return torch.randn(1, S, d, generator=torch.Generator().manual_seed(seed))


# -- shared compressors (ratio 2 at layer 2, ratio 1 at layer 5) -------------------------------


@pytest.mark.parametrize("layer", [2, 5])
def test_shared_compressor_entries_and_index_keys(model, ref, layer: int) -> None:
    attn = model.layers[layer].attn
    state = attn.new_state(1, torch.float32, torch.device("cpu"))
    x = _x(layer)
    for part in _chunks(x):
        attn._update_sources(model.ops, part, model.rotary["compress"], state, SharedKV())
    expected: dict[str, dict] = {"entries": {}, "keys": {}}
    ref._sources(layer, x[0].to(F64), expected)
    ratio = TEXT["compress_ratios"][layer]
    assert state.compressor.num_entries == S // ratio
    assert state.compressor.buf_kv.shape[1] == S % ratio  # the open half of a pair waits
    got_e, got_k = state.compressor.entries[0].double(), state.indexer.entries[0].double()
    torch.testing.assert_close(got_e, torch.stack(expected["entries"][layer]), atol=2e-5, rtol=0)
    torch.testing.assert_close(got_k, torch.stack(expected["keys"][layer]), atol=2e-5, rtol=0)


# -- candidate indexer ----------------------------------------------------------------------------


def test_candidate_source_and_restricted_index_source(model, ref) -> None:
    """Layer 5 publishes candidate blocks; layer 7 picks only inside them (ratio 1: T = S)."""
    g = torch.Generator().manual_seed(7)
    keys = torch.randn(1, S, TEXT["index_head_dim"], generator=g)
    x = torch.randn(1, S, TEXT["hidden_size"], generator=g)
    qr = torch.randn(1, S, TEXT["q_lora_rank"], generator=g)
    positions = torch.arange(S)
    visible = (torch.arange(S)[None, :] < (positions + 1)[:, None])[None]
    rot = model.rotary["compress"]
    idx5, idx7 = model.layers[5].attn.indexer, model.layers[7].attn.indexer
    sc5 = idx5.scores(model.ops, x, qr, positions, rotary=rot, keys=keys)
    picks5, cands = idx5.select(
        model.ops, sc5, visible, within=None, publish_candidates=True, own_candidates=False
    )
    sc7 = idx7.scores(model.ops, x, qr, positions, rotary=rot, keys=keys)
    picks7, none = idx7.select(
        model.ops, sc7, visible, within=cands, publish_candidates=False, own_candidates=False
    )
    assert none is None
    keys64 = [k.to(F64) for k in keys[0]]
    bs, nb, k = TEXT["candidate_block_size"], TEXT["candidate_topk_blocks"], TEXT["index_topk"]
    restricted = 0
    for t in range(S):
        vis = t + 1
        ref5 = ref.index_scores(5, x[0, t].double(), qr[0, t].double(), t, keys64[:vis])
        ref7 = ref.index_scores(7, x[0, t].double(), qr[0, t].double(), t, keys64[:vis])
        torch.testing.assert_close(
            sc5[0, t, :vis].double(), torch.tensor(ref5, dtype=F64), atol=1e-5, rtol=0
        )
        torch.testing.assert_close(
            sc7[0, t, :vis].double(), torch.tensor(ref7, dtype=F64), atol=1e-5, rtol=0
        )
        blocks = [(max(ref5[b * bs : min(vis, b * bs + bs)]), b) for b in range(-(-vis // bs))]
        cand = {w for b in top_ids(blocks, nb) for w in range(b * bs, min(vis, b * bs + bs))}
        assert set(torch.nonzero(cands[0, t]).flatten().tolist()) == cand
        want5 = top_ids([(ref5[w], w) for w in range(vis)], k)
        want7 = top_ids([(ref7[w], w) for w in sorted(cand)], k)
        assert [p for p in picks5[0, t].tolist() if p >= 0] == want5
        assert [p for p in picks7[0, t].tolist() if p >= 0] == want7
        restricted += want7 != top_ids([(ref7[w], w) for w in range(vis)], k)
    assert restricted > 0  # the candidate restriction changed some picks


def test_selection_breaks_ties_by_lower_id_and_marks_missing() -> None:
    ops = TorchBackend("cpu")
    scores = torch.tensor([[[1.0, 3.0, 3.0, 0.0, 3.0, 9.0]]])
    allowed = torch.tensor([[[True, True, True, True, True, False]]])
    assert pick_topk(ops, scores, allowed, 3).tolist() == [[[1, 2, 4]]]
    assert pick_topk(ops, scores, allowed & (torch.arange(6) < 1), 3).tolist() == [[[0, -1, -1]]]
    # blocks of 2: maxima [3, 3, 3(+9 invisible)] -> the two lowest ids win the tie
    cand = candidate_blocks(ops, scores, allowed, block=2, topk_blocks=2)
    assert cand.tolist() == [[[True, True, True, True, False, False]]]


# -- lagged mHC ----------------------------------------------------------------------------------


def test_lagged_mhc_chain(model) -> None:
    """Two sublayers: the first reads stream 0, the second the first HC's pre; the last pre
    collapses the output."""
    n, d = TEXT["hc_mult"], TEXT["hidden_size"]
    g = torch.Generator().manual_seed(11)
    x = torch.randn(2, 5, n, d, generator=g)
    w1, w2 = torch.randn(d, d, generator=g) / 8, torch.randn(d, d, generator=g) / 8
    block = model.layers[3]
    hc_a = LaggedHyperConnection(block, "hc_attn", model.cfg)
    hc_f = LaggedHyperConnection(block, "hc_ffn", model.cfg)
    y, pre = hc_a(model.ops, x, None, lambda u: torch.tanh(u @ w1.T))
    y, pre = hc_f(model.ops, y, pre, lambda u: torch.tanh(u @ w2.T))
    out = model.ops.mhc_collapse(y, pre)

    params = {k: [getattr(block, f"hc_{k}_{p}") for p in ("fn", "base", "scale")]
              for k in ("attn", "ffn")}  # fmt: skip
    for b in range(2):
        for t in range(5):
            xs = x[b, t].double()
            p1, post1, comb1 = mhc_weights(xs, *params["attn"], TEXT)
            xs = hc_post(torch.tanh(w1.double() @ xs[0]), xs, post1, comb1)
            p2, post2, comb2 = mhc_weights(xs, *params["ffn"], TEXT)
            u = sum(p1[i] * xs[i] for i in range(n))
            xs = hc_post(torch.tanh(w2.double() @ u), xs, post2, comb2)
            want = sum(p2[i] * xs[i] for i in range(n))
            torch.testing.assert_close(y[b, t].double(), xs, atol=2e-5, rtol=0)
            torch.testing.assert_close(out[b, t].double(), want, atol=2e-5, rtol=0)


# -- Engram hashing and gate -------------------------------------------------------------------


def test_engram_primes_reproduce_the_published_table_sizes() -> None:
    """§2.3: 8 heads x n-gram sizes 2..4 from 16M, layers 1 and 14 -> these row counts."""
    primes = table_primes([1, 14], [16_000_000] * 3, 8)
    assert [sum(sum(p) for p in primes[layer]) for layer in (1, 14)] == [384006168, 384016682]
    small = table_primes([1, 4], [11, 30], 3)
    ref = engram_primes([1, 4], 11, 1, 3)  # one n-gram size at a time in the reference
    assert small[1][0] == ref[1][:3] and small[4][0] == ref[4][:3]
    flat = [p for layer in (1, 4) for size in small[layer] for p in size]
    assert len(set(flat)) == len(flat)  # never reused, across sizes and layers


def test_engram_multipliers() -> None:
    for layer in (1, 14):
        got = hash_multipliers(layer, 4, 99092, 0).tolist()
        assert got == engram_multipliers(layer, 4, 99092)
        assert all(m % 2 == 1 for m in got)


def test_engram_rows_stream_with_history(model) -> None:
    engram = model.layers[1].engram
    hist = model.engram_history
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, TEXT["vocab_size"], (2, S), generator=g)
    pad = TEXT["engram_pad_token_id"]
    got, history = [], torch.full((2, hist), pad)
    for part in _chunks(ids):
        raw = torch.cat((history, part), dim=1)
        got.append(engram.rows(raw, hist))
        history = raw[:, -hist:]
    got_rows = torch.cat(got, dim=1)
    mult = engram_multipliers(
        1, TEXT["engram_max_ngram_size"], TEXT["engram_compressed_vocab_size"]
    )
    primes = engram_primes([1], TEXT["engram_vocab_size"], 2, TEXT["engram_n_heads"])[1]
    for b in range(2):
        seq = ids[b].tolist()
        for t in range(S):
            want = engram_rows(seq, t, pad=pad, mult=mult, primes=primes, heads=2)
            assert got_rows[b, t].tolist() == want


def test_engram_gate_and_update(model) -> None:
    engram = model.layers[1].engram
    n, d = TEXT["hc_mult"], TEXT["hidden_size"]
    g = torch.Generator().manual_seed(9)
    x = torch.randn(1, 6, n, d, generator=g)
    ids = torch.randint(0, TEXT["vocab_size"], (1, 6 + model.engram_history), generator=g)
    skip = torch.tensor([[False, False, True, False, False, False]])
    out = engram(model.ops, x, ids, model.engram_history, skip)
    rows = engram.rows(ids, model.engram_history)
    sd = {k: v.double() for k, v in model.state_dict().items()}
    for t in range(6):
        want = (
            x[0, t].double()
            if skip[0, t]
            else engram_apply(sd, "layers.1.engram.", x[0, t].double(), rows[0, t].tolist(), TEXT)
        )
        torch.testing.assert_close(out[0, t].double(), want, atol=2e-5, rtol=0)
    assert not torch.equal(out[0, 0], x[0, 0])


class _FakeTokenizer:
    """decode/convert_ids_to_tokens over a fixed piece list (a transformers-style tokenizer)."""

    PIECES = ("Hello", " hello", "HÉLLO", "ﬁne", "fine", "  ", "\t\n", "a\ufffd", "b\ufffd", "")

    def __len__(self) -> int:
        return len(self.PIECES)

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(self.PIECES[i] for i in ids)

    def convert_ids_to_tokens(self, tid: int) -> str:
        return f"<raw{tid}>"


def _ref_normalise(text: str) -> str:
    """NFKC, NFD, strip accents, lower-case, collapse whitespace, strip (a lone space stays)."""
    t = unicodedata.normalize("NFD", unicodedata.normalize("NFKC", text))
    t = "".join(c for c in t if not unicodedata.combining(c)).lower()
    t = re.sub(r"[ \t\r\n]+", " ", t)
    return " " if t == " " else t.strip()


def test_compressed_token_map() -> None:
    tok = _FakeTokenizer()
    table = build_compressed_token_map(tok).tolist()
    keys: dict[str, int] = {}
    want = []
    for tid, piece in enumerate(tok.PIECES):
        key = (
            tok.convert_ids_to_tokens(tid)
            if "\ufffd" in piece
            else (_ref_normalise(piece) or piece)
        )
        want.append(keys.setdefault(key, len(keys)))
    assert table == want
    # "Hello", " hello" and "HÉLLO" merge; "ﬁne" (ligature) and "fine" merge; whitespace-only
    # pieces merge into " "; partial UTF-8 pieces stay apart.
    assert table[0] == table[1] == table[2] and table[3] == table[4] and table[5] == table[6]
    assert table[7] != table[8]
