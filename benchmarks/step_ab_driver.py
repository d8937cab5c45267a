#!/usr/bin/env python3
"""Old code vs new code, one process each, alternating: is the new step API as fast?

Two versions of ``deepinfer`` cannot share a process, and measuring all of one version and then
all of the other mixes any drift of the machine (clocks, a neighbour's load) into the
difference. So ``step_ab.py`` runs in a fresh interpreter per (round, version), in the order
old, new, old, new, ..., each with ``PYTHONPATH`` set to that version's source folders, and
the result holds every run, each metric's median per version and the new/old ratio of the
medians (with the ratio of each round's pair, to show how much the rounds agree).

    python benchmarks/step_ab_driver.py --old "$(ls -d /tmp/old/packages/*/src | tr '\\n' :)" \\
        --new "$(ls -d packages/*/src | tr '\\n' :)" --what midsize --device cuda \\
        --rounds 3 --out benchmarks/results/step_api_ab_h200.json --backend sm100

Options this script does not know (``--backend sm100``, ``--small``, ``--tiny-args ...``) go
to every ``step_ab.py`` run unchanged.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from _results import write_result

STEP_AB = Path(__file__).resolve().parent / "step_ab.py"
VERSIONS = ("old", "new")


def source_of(pythonpath: str) -> dict[str, Any]:
    """The commit and uncommitted changes of the checkout that holds the first source folder,
    so a result says which code each side was (a PYTHONPATH string alone does not)."""
    first = next((p for p in pythonpath.split(os.pathsep) if p), ".")

    def git(*args: str) -> str:
        done = subprocess.run(
            ["git", "-C", first, *args], capture_output=True, text=True, check=False
        )
        return done.stdout.strip() if done.returncode == 0 else ""

    # Untracked files count: a refactor in progress adds modules before anything is committed.
    changed = git("status", "--porcelain", "--", ":(top)packages")
    return {
        "pythonpath": pythonpath,
        "commit": git("rev-parse", "--short", "HEAD") or None,
        "modified_files": len(changed.splitlines()),
    }


def run_one(version: str, pythonpath: str, argv: list[str], out: Path) -> dict[str, Any]:
    """One ``step_ab.py`` run in a fresh interpreter on ``pythonpath`` alone (the caller's
    PYTHONPATH would mix versions). Its progress streams to this terminal's stderr; its result
    is read from ``out``, not stdout, where a library might print."""
    # An empty entry (the trailing ':' of `ls -d ... | tr '\\n' :`) would put the cwd on sys.path.
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in pythonpath.split(os.pathsep) if p),
    }
    cmd = [sys.executable, str(STEP_AB), *argv, "--out", str(out)]
    print(f"--- {version}: {shlex.join(cmd[1:])}", file=sys.stderr, flush=True)
    done = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, check=False)
    if done.returncode:
        raise SystemExit(f"step_ab.py failed for {version} (exit {done.returncode})")
    result: dict[str, Any] = json.loads(out.read_text())
    # An editable install's import hook would beat PYTHONPATH and run the wrong code silently.
    folders = [Path(p).resolve() for p in pythonpath.split(os.pathsep) if p]
    if not any(Path(result["deepinfer"]).is_relative_to(f) for f in folders):
        raise SystemExit(f"{version} imported {result['deepinfer']}, not from {pythonpath}")
    return result


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per metric: the median of each version's runs, new/old of the medians, and new/old of
    each round's pair (``paired``), whose spread shows the noise the ratio carries."""
    names = list(dict.fromkeys(k for r in runs for k in r["result"]["metrics"]))
    by: dict[str, dict[str, list[float]]] = {v: {n: [] for n in names} for v in VERSIONS}
    for r in runs:
        for name, value in r["result"]["metrics"].items():
            by[r["version"]][name].append(value)
    medians = {
        v: {n: round(statistics.median(x), 4) for n, x in by[v].items() if x} for v in VERSIONS
    }
    ratio: dict[str, float] = {}
    paired: dict[str, list[float]] = {}
    for name in names:
        old, new = medians["old"].get(name), medians["new"].get(name)
        if old and new is not None:
            ratio[name] = round(new / old, 4)
        pairs = zip(by["old"][name], by["new"][name], strict=False)
        paired[name] = [round(n / o, 4) for o, n in pairs if o]
    return {"median": medians, "ratio_new_over_old": ratio, "paired_ratio_new_over_old": paired}


def higher_is_better(metric: str) -> bool:
    """Throughputs (``..._per_s``) go up when faster; times (``..._ms``, ``seconds``) down."""
    return metric.endswith("_per_s")


def table(summary: dict[str, Any]) -> str:
    """Old and new medians side by side, the ratio, the rounds' spread, and which way is
    better, so a reader need not know each metric's direction."""
    rows = [("metric", "old", "new", "new/old", "rounds", "better")]
    for name, ratio in summary["ratio_new_over_old"].items():
        paired = summary["paired_ratio_new_over_old"][name]
        spread = f"{min(paired):.3f}-{max(paired):.3f}" if paired else "-"
        rows.append(
            (
                name,
                f"{summary['median']['old'][name]:g}",
                f"{summary['median']['new'][name]:g}",
                f"{ratio:.3f}",
                spread,
                "higher" if higher_is_better(name) else "lower",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows)


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter, allow_abbrev=False
    )
    ap.add_argument("--old", required=True, help="PYTHONPATH of the old version's src folders")
    ap.add_argument("--new", required=True, help="PYTHONPATH of the new version's src folders")
    ap.add_argument("--what", choices=("midsize", "tiny"), required=True)
    ap.add_argument("--device", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    args, extra = ap.parse_known_args()
    paths = {"old": args.old, "new": args.new}
    argv = ["--what", args.what, "--device", args.device, *extra]
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.rounds):
            for version in VERSIONS:
                out = Path(tmp) / f"{round_}_{version}.json"
                result = run_one(version, paths[version], argv, out)
                runs.append({"round": round_, "version": version, "result": result})
                print(f"round {round_} {version}: {result['metrics']}", file=sys.stderr)
    summary = summarise(runs)
    first = runs[0]["result"]
    result = {
        "what": args.what,
        "device": args.device,
        "device_name": first["device_name"],
        "torch": first["torch"],
        "step_ab_args": argv,
        "rounds": args.rounds,
        "order": "old, new alternating, one fresh process per run",
        "api": {
            v: next(r["result"]["details"].get("api") for r in runs if r["version"] == v)
            for v in VERSIONS
        },
        "source": {v: source_of(paths[v]) for v in VERSIONS},
        **summary,
        "runs": runs,
    }
    print(table(summary))
    write_result(result, args.out, f"step_ab_{args.what}_{args.device.split(':')[0]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
