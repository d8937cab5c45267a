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

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

HERE = Path(__file__).parent
GOLDEN = HERE.parent / "data" / "image_golden.json"
SEEDS = {"tokens": 3, "preprocess": 23, "accounting": 11}
COUNTS = {"tokens": 6000, "preprocess": 160, "accounting": 60}


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"_recipe_golden_{name}", HERE / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def golden_cases(image_dir: Path) -> list[dict[str, Any]]:
    """The golden cases; writes the image files they read into ``image_dir``."""
    gen, harness = _load("image_generate"), _load("image_harness")
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
    python = os.environ["DEEPSEEK_RECIPE_ORACLE_PYTHON"]
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        cases = golden_cases(tmp_path)
        cases_path = tmp_path / "cases.json"
        out_path = tmp_path / "oracle.json"
        cases_path.write_text(json.dumps(cases), encoding="utf-8")
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
        subprocess.run(
            [python, "-I", str(HERE / "image_harness.py"), str(cases_path), tmp, str(out_path)],
            check=True,
            env=env,
            timeout=1800,
        )
        results = json.loads(out_path.read_text(encoding="utf-8"))
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
