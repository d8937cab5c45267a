"""The ``deepinfer`` command line."""

from __future__ import annotations

import argparse
import json
import sys

from deepinfer import info


def _cmd_info(args: argparse.Namespace) -> int:
    report = info.collect()
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(info.format_report(report))
    return 1 if report.errors else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="deepinfer", description="DeepInfer: inference for DeepSeek-V4-family models"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p_info = sub.add_parser(
        "info", help="installed DeepInfer packages, plugins, and the device/backend in use"
    )
    p_info.add_argument("--json", action="store_true", help="machine-readable output")
    p_info.set_defaults(func=_cmd_info)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
