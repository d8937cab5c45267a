"""Rebuild tests/data/image_golden.json from the official deepseek-recipe wheel.

Usage (from the repository root, with Pillow in the running interpreter):

    DEEPSEEK_RECIPE_ORACLE_PYTHON=.venv-recipe-oracle/bin/python \\
        .venv/bin/python packages/deepseek-recipe/tests/parity/build_image_golden.py

The golden file holds the cases and the official results, so the fast test suite
checks this package against the official behaviour without the official wheel.
Cases whose outcome hangs on the exact bytes an encoder writes (truncations) and
the slowest ones stay in the parity suite only.
"""

from __future__ import annotations

import json
import os
import runpy
import tempfile
from pathlib import Path
from typing import Any

load = runpy.run_path(str(Path(__file__).with_name("_oracle.py")))["load"]
oracle = load("_oracle")

GOLDEN = Path(__file__).parent.parent / "data" / "image_golden.json"
SEEDS = {"tokens": 3, "preprocess": 23, "accounting": 11}
COUNTS = {"tokens": 6000, "preprocess": 160, "accounting": 60}


def golden_cases(image_dir: Path) -> list[dict[str, Any]]:
    """The golden cases; writes the image files they read into ``image_dir``."""
    gen, harness = load("image_generate"), load("image_harness")
    cases = gen.token_cases(seed=SEEDS["tokens"], count=COUNTS["tokens"])
    cases += gen.preprocess_cases(SEEDS["preprocess"], COUNTS["preprocess"], image_dir)
    cases += gen.special_preprocess_cases(image_dir)
    cases += [
        case for case in gen.resolve_cases() if case.get("calls", 1) * len(case["sources"]) <= 100
    ]
    cases += gen.accounting_cases(seed=SEEDS["accounting"], count=COUNTS["accounting"])
    cases += gen.api_cases(harness.api_probe_names())
    return cases


def main() -> None:
    python = os.environ[oracle.ORACLE_ENV]
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        cases = golden_cases(tmp_path)
        results = oracle.run_oracle(
            python, "image_harness.py", cases, tmp_path, image_dir=tmp_path, timeout=1800
        )
    golden = {
        "source": "deepseek-recipe 0.2.0 (official wheel), tests/parity/image_harness.py",
        "seeds": SEEDS,
        "counts": COUNTS,
        "cases": cases,
        "results": results,
    }
    GOLDEN.write_text(json.dumps(golden, separators=(",", ":")) + "\n", encoding="utf-8")
    print(f"wrote {len(cases)} cases to {GOLDEN}")


if __name__ == "__main__":
    main()
