"""The spec tests' helper modules (``_spec_drafters``) on sys.path: the repository runs pytest
with ``--import-mode=importlib``, which puts no test folder there."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
