"""What every parity test needs: loading the parity modules and running the official wheel.

tests/parity is not a package: its harnesses also run as scripts under the
official package's interpreter (with `-I`, so not even their own folder is on
the path).  Its modules therefore load one another by path through `load`; a
file gets `load` itself with

    load = runpy.run_path(str(PARITY_DIR / "_oracle.py"))["load"]

This module imports only the standard library (pytest lazily), because the
harnesses load it inside the official package's interpreter too.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

HERE = Path(__file__).parent
ORACLE_ENV = "DEEPSEEK_RECIPE_ORACLE_PYTHON"
MAX_REPORTED = 8


def load(name: str) -> ModuleType:
    """tests/parity/NAME.py, run once per process so every importer shares one module.

    It is registered in `sys.modules` before it runs, so dataclasses and
    `__module__` checks inside it work as for an imported module.
    """
    key = f"_recipe_parity_{name}"
    module = sys.modules.get(key)
    if module is not None:
        return module
    spec = importlib.util.spec_from_file_location(key, HERE / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[key] = module
    spec.loader.exec_module(module)
    return module


def oracle_python() -> str:
    """The official package's interpreter; without one the calling test is skipped."""
    import pytest

    python = os.environ.get(ORACLE_ENV)
    if not python:
        pytest.skip(f"{ORACLE_ENV} is not set (create one with tools/recipe_oracle_venv.sh)")
    return python


def run_oracle(
    python: str,
    script: str,
    cases: list[dict[str, Any]],
    workdir: Path,
    *,
    image_dir: Path | None = None,
    timeout: float = 600,
) -> list[Any]:
    """The results of tests/parity/SCRIPT on `cases` under the official interpreter.

    `-I` and an environment without PYTHONPATH/PYTHONHOME keep this repository's
    `deepseek_recipe` out of that interpreter, so the wheel answers alone.  The
    image harness also reads the case images from `image_dir`.
    """
    cases_path = workdir / "oracle_cases.json"
    out_path = workdir / "oracle_results.json"
    cases_path.write_text(json.dumps(cases), encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    inputs = [str(cases_path)] if image_dir is None else [str(cases_path), str(image_dir)]
    subprocess.run(
        [python, "-I", str(HERE / script), *inputs, str(out_path)],
        check=True,
        cwd=workdir,
        env=env,
        timeout=timeout,
    )
    return json.loads(out_path.read_text(encoding="utf-8"))


def compare(
    cases: list[dict[str, Any]],
    ours: list[Any],
    theirs: list[Any],
    *,
    case_chars: int,
    value_chars: int,
) -> None:
    """Fail with the first differing cases, each field shown on both sides (cut to size)."""
    mismatches = [(i, o, t) for i, (o, t) in enumerate(zip(ours, theirs, strict=True)) if o != t]
    report = []
    for i, o, t in mismatches[:MAX_REPORTED]:
        report.append(f"case {i}: {json.dumps(cases[i], ensure_ascii=False)[:case_chars]}")
        for key in sorted(set(o) | set(t)):
            if o.get(key) != t.get(key):
                ours_text = json.dumps(o.get(key), ensure_ascii=False)[:value_chars]
                theirs_text = json.dumps(t.get(key), ensure_ascii=False)[:value_chars]
                report.append(f"  {key}: ours={ours_text}")
                report.append(f"  {key}: official={theirs_text}")
    assert not mismatches, f"{len(mismatches)}/{len(cases)} cases differ\n" + "\n".join(report)


def check_dump(
    package: ModuleType,
    dump: str,
    cases: list[dict[str, Any]],
    tmp_path: Path,
    *,
    case_chars: int,
    value_chars: int,
) -> None:
    """Run `cases` through the harness tests/parity/DUMP.py on both packages and compare.

    `package` is this repository's `deepseek_recipe`, passed in because this
    module is also loaded where that name means the official wheel.  Our side
    goes through a JSON round trip so both sides are compared as plain JSON.
    """
    python = oracle_python()
    theirs = run_oracle(python, f"{dump}.py", cases, tmp_path)
    ours = json.loads(json.dumps(load(dump).run_all(package, cases), ensure_ascii=False))
    compare(cases, ours, theirs, case_chars=case_chars, value_chars=value_chars)
