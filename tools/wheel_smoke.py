#!/usr/bin/env python3
"""Install built wheels into fresh venvs the way deployments do, and check what arrives.

For each scenario (``deepinfer[sm100]``, ``deepinfer[ascend]``, ``deepinfer[all]``, and
``deepseek-recipe`` alone) a new venv first gets the third-party requirements (read from the
wheels' metadata; torch pinned to the CPU build), then our packages with ``--no-index`` from the
wheel folder only, so nothing of ours can come from an index. Torch is installed once, in a venv
of its own that the scenarios needing it see through a ``.pth`` file: it is by far the largest
install, and what is checked is how our wheels install beside it. It then checks that exactly the
expected DeepInfer distributions were installed and that ``deepinfer info`` discovers every plugin
those wheels register.

Usage: python tools/wheel_smoke.py DIST_DIR [SCENARIO ...]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import venv
import zipfile
from dataclasses import dataclass
from email.parser import Parser
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

# The CPU wheel, as in tools/bootstrap.sh (which honours the same variable).
TORCH = os.environ.get("DEEPINFER_TORCH", "torch==2.13.0")


@dataclass
class Wheel:
    name: str
    path: Path
    requires: list[Requirement]
    entry_points: dict[str, set[str]]


def read_wheels(dist: Path) -> dict[str, Wheel]:
    wheels: dict[str, Wheel] = {}
    for path in sorted(dist.glob("*.whl")):
        with zipfile.ZipFile(path) as zf:
            meta_name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
            meta = Parser().parsestr(zf.read(meta_name).decode())
            eps: dict[str, set[str]] = {}
            ep_name = meta_name.replace("METADATA", "entry_points.txt")
            group = None
            if ep_name in zf.namelist():
                for raw in zf.read(ep_name).decode().splitlines():
                    line = raw.strip()
                    if line.startswith("["):
                        group = line[1:-1]
                    elif "=" in line and group and group.startswith("deepinfer."):
                        eps.setdefault(group, set()).add(line.split("=", 1)[0].strip())
        name = canonicalize_name(meta["Name"])
        reqs = [Requirement(r) for r in meta.get_all("Requires-Dist") or []]
        wheels[name] = Wheel(name, path, reqs, eps)
    return wheels


def closure(target: str, wheels: dict[str, Wheel]) -> tuple[set[str], list[str]]:
    """Our distributions and the third-party requirements that installing ``target`` pulls."""
    root = Requirement(target)
    ours: set[str] = set()
    external: dict[str, str] = {}
    stack = [(canonicalize_name(root.name), set(root.extras))]
    while stack:
        name, extras = stack.pop()
        if name in ours and not extras:
            continue
        ours.add(name)
        for req in wheels[name].requires:
            envs = [{"extra": e} for e in extras] + [{"extra": ""}]
            if req.marker is not None and not any(req.marker.evaluate(env) for env in envs):
                continue
            dep = canonicalize_name(req.name)
            if dep in wheels:
                stack.append((dep, set(req.extras)))
            else:
                extra = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
                external[f"{req.name}{extra}{req.specifier}"] = dep
    return ours, sorted(external)


def run(cmd: list[str], **kw: object) -> str:
    print("+", " ".join(cmd), flush=True)
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw).stdout  # type: ignore[call-overload]


def install_from_index(pip: list[str], requirements: list[str], tries: int = 3) -> None:
    """Install third-party requirements from the public index, retrying a failed attempt: a stalled
    download raises a read timeout that pip's own retries do not cover."""
    for attempt in range(1, tries + 1):
        try:
            run([*pip, "--retries", "5", "--timeout", "60", *requirements])
            return
        except subprocess.CalledProcessError as exc:
            if attempt == tries:
                raise
            print(f"pip failed ({exc.stderr.strip().splitlines()[-1:]}), retrying", flush=True)
            time.sleep(10)


def site_packages(py: str) -> Path:
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    return Path(run([py, "-c", code]).strip())


def torch_site(workdir: Path) -> Path:
    """site-packages of a venv holding only torch (created on first use)."""
    env_dir = workdir / "torch-base"
    py = str(env_dir / "bin" / "python")
    if not env_dir.is_dir():
        venv.create(env_dir, with_pip=True)
        install_from_index([py, "-m", "pip", "install", "--quiet"], [TORCH])
    return site_packages(py)


def smoke(target: str, wheels: dict[str, Wheel], dist: Path, workdir: Path) -> list[str]:
    ours, external = closure(target, wheels)
    env_dir = workdir / canonicalize_name(target.replace("[", "-").replace("]", ""))
    venv.create(env_dir, with_pip=True)
    py = str(env_dir / "bin" / "python")
    pip = [py, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    if any(canonicalize_name(Requirement(r).name) == "torch" for r in external):
        (site_packages(py) / "torch_base.pth").write_text(f"{torch_site(workdir)}\n")
    if external:
        install_from_index(pip, external)
    run([*pip, "--no-index", "--find-links", str(dist), target])

    problems: list[str] = []
    listed = json.loads(run([py, "-m", "pip", "list", "--format", "json"]))
    installed = {canonicalize_name(p["name"]) for p in listed}
    got = installed & set(wheels)
    if got != ours:
        problems.append(f"{target}: installed {sorted(got)}, expected {sorted(ours)}")
    if "torch-npu" in installed:
        problems.append(f"{target}: torch-npu was installed")

    if "deepinfer-core" in ours:
        report = json.loads(run([str(env_dir / "bin" / "deepinfer"), "info", "--json"]))
        want: dict[str, set[str]] = {}
        for name in ours:
            for group, names in wheels[name].entry_points.items():
                want.setdefault(group, set()).update(names)
        seen = {g: {p["name"] for p in items} for g, items in report["plugins"].items() if items}
        if seen != want:
            problems.append(f"{target}: deepinfer info lists {seen}, wheels register {want}")
        if report["errors"]:
            problems.append(f"{target}: deepinfer info errors {report['errors']}")
    else:
        code = (
            "import importlib.util, deepseek_recipe;"
            "assert importlib.util.find_spec('torch') is None, 'torch is installed'"
        )
        run([py, "-c", code])
    print(f"{target}: {len(ours)} of ours, {len(external)} third-party requirements", flush=True)
    return problems


SCENARIOS = ["deepinfer[sm100]", "deepinfer[ascend]", "deepinfer[all]", "deepseek-recipe"]


def main(argv: list[str]) -> int:
    dist = Path(argv[1]).resolve()
    scenarios = argv[2:] or SCENARIOS
    wheels = read_wheels(dist)
    problems: list[str] = []
    with tempfile.TemporaryDirectory(prefix="deepinfer-wheels-") as tmp:
        for target in scenarios:
            problems += smoke(target, wheels, dist, Path(tmp))
    for p in problems:
        print("FAIL:", p)
    print(f"wheel smoke: {len(scenarios)} scenarios, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
