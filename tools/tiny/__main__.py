"""``python tools/tiny tokenizer OUT_DIR``: train the tiny model's tokenizer and save it."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tiny.bpe import train_tokenizer
from tiny.corpus import load_corpus


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[1] != "tokenizer":
        print("usage: python tools/tiny tokenizer OUT_DIR", file=sys.stderr)
        return 2
    out = Path(argv[2])
    out.mkdir(parents=True, exist_ok=True)
    corpus = load_corpus()
    tok = train_tokenizer([corpus.train_text])
    tok.save(str(out / "tokenizer.json"))
    print(f"wrote {out / 'tokenizer.json'} ({tok.get_vocab_size()} tokens)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
