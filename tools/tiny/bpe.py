"""The tiny model's tokenizer: byte-level BPE with DeepSeek-V4.1's chat control tokens.

Byte-level, so any text (including text the corpus never saw) encodes and decodes losslessly.
The control tokens keep their exact DeepSeek spellings, so ``deepseek_recipe`` renders and encodes
chats for this tokenizer just as for the real one. As in the V4 tokenizer, BOS/EOS/pad sit at ids
0/1/2 and are special; the turn markers are added tokens with ``special=false`` (so
``skip_special_tokens`` keeps them, matching V4); the image placeholder is special.
"""

from __future__ import annotations

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
PAD = "<｜▁pad▁｜>"
SPECIAL = (BOS, EOS, PAD)
#: Chat markers: added tokens, not special (as in the V4 tokenizer).
CHAT_TOKENS = (
    "<｜User｜>",
    "<｜Assistant｜>",
    "<｜System｜>",
    "<think>",
    "</think>",
    "｜DSML｜",
    "<｜latest_reminder｜>",
)
IMAGE = "<｜image｜>"
VOCAB_SIZE = 8192


def train_tokenizer(texts: list[str], vocab_size: int = VOCAB_SIZE) -> Tokenizer:
    """Train on ``texts`` (the training split only); deterministic for the same input."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    extra = len(CHAT_TOKENS) + 1
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - extra,
        min_frequency=2,
        special_tokens=list(SPECIAL),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in CHAT_TOKENS])
    tok.add_special_tokens([AddedToken(IMAGE, special=True, normalized=False)])
    return tok
