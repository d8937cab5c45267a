"""What a grammar may emit at the token level: valid UTF-8 only, and never a control token.

Independent oracles: Python's strict incremental UTF-8 decoder, and the tokenizer's own list of
added tokens.
"""

from __future__ import annotations

import codecs
import itertools
import random

import pytest
import torch

from deepinfer.assets import tiny_tokenizer
from deepinfer.sampling_params import StructuredOutputsParams
from deepinfer_structured.utf8 import Utf8Guard, token_bytes


def decodes(data: bytes) -> bool:
    """Whether ``data`` is a valid UTF-8 prefix: Python's strict decoder accepts it, and its
    unfinished last character has some completion the decoder accepts (the incremental
    decoder alone does not check a buffered second byte against the first)."""
    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    try:
        decoder.decode(data, final=False)
    except UnicodeDecodeError:
        return False
    pending = decoder.getstate()[0]
    if not pending:
        return True
    length = 2 if pending[0] < 0xE0 else 3 if pending[0] < 0xF0 else 4
    edges = (0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF)
    for suffix in itertools.product(edges, repeat=length - len(pending)):
        try:
            (pending + bytes(suffix)).decode("utf-8")
        except UnicodeDecodeError:
            continue
        return True
    return False


def test_utf8_guard_allows_exactly_the_valid_continuations() -> None:
    tokenizer = tiny_tokenizer()
    guard = Utf8Guard(tokenizer, 8192, [1])
    table = token_bytes(tokenizer, 8192)
    text_tokens = [i for i, data in enumerate(table) if data]
    rng = random.Random(0)
    # Prefixes ending inside characters of every length, then a full comparison per prefix.
    prefixes = [b"", "é".encode()[:1], "€".encode()[:1], "€".encode()[:2], "😀".encode()[:3]]
    prefixes += [b"\xed", b"\xe0", b"\xf0", b"\xf4", b"\xf4\x8f"]
    for prefix in prefixes:
        state = 0
        for byte in prefix:
            state = guard.advance(state, tokenizer.token_to_id(_byte_token(byte)))
        mask = guard.mask(state)
        for token in text_tokens:
            assert bool(mask[token]) == decodes(prefix + table[token]), (prefix, table[token])
    # Long walks through the guard alone stay decodable.
    for _ in range(20):
        state, data = 0, b""
        for _ in range(200):
            choices = guard.mask(state).nonzero()[:, 0].tolist()
            token = rng.choice([t for t in choices if table[t]])
            state = guard.advance(state, token)
            data += table[token]
            assert decodes(data)


def _byte_token(byte: int) -> str:
    """The byte-level token text of one byte (GPT-2's printable mapping)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    if byte in printable:
        return chr(byte)
    return chr(256 + [b for b in range(256) if b not in printable].index(byte))


@pytest.mark.parametrize("name", ["xgrammar", "llguidance"])
def test_control_tokens_are_never_text_under_a_grammar(make_engine, name: str) -> None:  # type: ignore[no-untyped-def]
    engine = make_engine(structured_outputs_backend=name)
    backend = engine.grammar_backend()
    added = set(engine.tokenizer.get_added_tokens_decoder())
    matcher = backend.matcher(StructuredOutputsParams(json={"type": "string"}))
    quote = engine.tokenizer.token_to_id('"')
    assert matcher.accept(quote)
    inside = matcher.allowed()
    assert inside.sum() > 1000  # any text
    assert not inside[sorted(added)].any()  # but never BOS, </think>, ｜DSML｜, ...
    assert matcher.accept(quote)
    assert matcher.allowed().nonzero()[:, 0].tolist() == [1]  # then only the stop token


@pytest.mark.parametrize("name", ["xgrammar", "llguidance"])
def test_batched_bitmask_rows_equal_the_bool_masks(make_engine, name: str) -> None:  # type: ignore[no-untyped-def]
    """``fill_bitmask`` (for samplers that apply packed masks) agrees with ``allowed``, through
    free reasoning, the end of it and a JSON answer."""
    import xgrammar as xgr

    from deepinfer.structured import ReplyConstraint

    engine = make_engine(structured_outputs_backend=name)
    tok = engine.tokenizer
    backend = engine.grammar_backend()
    end = tok.token_to_id("</think>")
    constraint = ReplyConstraint(json={"type": "string"}, reasoning_end="</think>")
    matcher = backend.matcher(constraint)
    bitmask = xgr.allocate_token_bitmask(3, 8192)
    rng = random.Random(0)
    tokens = [*tok.encode("Well, sir", add_special_tokens=False).ids, end]
    for step in range(40):
        matcher.fill_bitmask(bitmask, 1)
        allowed = matcher.allowed()
        unpacked = ((bitmask[1].view(-1, 1) >> torch.arange(32)) & 1).flatten().bool()
        assert torch.equal(unpacked[:8192], allowed), step
        choice = (
            tokens[step] if step < len(tokens) else rng.choice(allowed.nonzero()[:, 0].tolist())
        )
        assert matcher.accept(choice)
        if matcher.is_terminated():
            break
