"""Where benchmark results go, and how they are written (one place for every script)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def write_result(result: dict[str, Any], out: Path | None, name: str) -> Path:
    """Write ``result`` as indented JSON to ``out`` (default ``results/<name>.json``)."""
    path = out or RESULTS / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path}")
    return path
