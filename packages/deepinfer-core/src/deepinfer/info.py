"""The environment report behind ``deepinfer info``: packages, plugins, device and backend.

It is the first thing to ask for in a bug report, so it must never raise: every failure (a broken
plugin, a conflict, a device probe that throws) becomes a line of the report instead.
"""

from __future__ import annotations

import platform
from dataclasses import asdict, dataclass, field
from importlib import metadata
from typing import Any

from deepinfer import plugins
from deepinfer.device import probe_device, select_backend
from deepinfer.errors import DeepInferError

DISTRIBUTIONS: tuple[str, ...] = (
    "deepinfer",
    "deepinfer-core",
    "deepseek-recipe",
    "deepinfer-kernels-sm100",
    "deepinfer-kernels-ascend",
    "deepinfer-spec",
    "deepinfer-structured",
)


@dataclass
class PluginReport:
    name: str
    distribution: str
    version: str
    target: str
    status: str  # "ok", "unavailable: ...", "load error: ..."


@dataclass
class InfoReport:
    python: str
    torch: str
    packages: dict[str, str | None]
    plugins: dict[str, list[PluginReport]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    device: dict[str, Any] = field(default_factory=dict)
    backend: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _plugin_status(registry: plugins.Registry, name: str) -> str:
    """Load the plugin and ask whether it can run here.

    Entry-point targets are light classes by contract, so loading them for a report is cheap; a
    plugin without an ``availability()`` classmethod is reported as merely registered.
    """
    try:
        obj = registry.load(name)
        check = getattr(obj, "availability", None)
        if check is None:
            return "registered"
        avail = check()
    except Exception as exc:
        return f"load error: {exc}"
    return "available" if avail.ok else f"unavailable: {avail.reason}"


def collect() -> InfoReport:
    try:
        import torch

        torch_version = torch.__version__
    except ImportError as exc:  # pragma: no cover - core depends on torch
        torch_version = f"not importable ({exc})"
    report = InfoReport(
        python=platform.python_version(),
        torch=torch_version,
        packages={d: _version(d) for d in DISTRIBUTIONS},
    )
    for reg in plugins.REGISTRIES:
        try:
            infos = reg.infos()
        except DeepInferError as exc:
            report.errors.append(str(exc))
            report.plugins[reg.group] = []
            continue
        report.plugins[reg.group] = [
            PluginReport(i.name, i.distribution, i.version, i.value, _plugin_status(reg, i.name))
            for i in infos
        ]
    try:
        dev = probe_device()
        report.device = asdict(dev)
        choice = select_backend("auto", probe=lambda: dev)
        report.backend = asdict(choice)
    except Exception as exc:
        report.errors.append(f"backend selection failed: {exc}")
    return report


def format_report(report: InfoReport) -> str:
    lines = [
        f"DeepInfer environment (Python {report.python}, torch {report.torch})",
        "",
        "Packages:",
    ]
    for dist, ver in report.packages.items():
        lines.append(f"  {dist:<26} {ver or '-- not installed'}")
    lines += ["", "Plugins:"]
    for group, items in report.plugins.items():
        lines.append(f"  {group}:" + ("" if items else " (none)"))
        for p in items:
            source = f"{p.distribution} {p.version}"
            lines.append(f"    {p.name:<12} {source:<32} {p.status}")
    dev = report.device
    if dev:
        cap = f", sm_{dev['capability'][0]}{dev['capability'][1]}" if dev.get("capability") else ""
        note = f" ({dev['note']})" if dev.get("note") else ""
        lines += ["", f"Device:  {dev['kind']} {dev['name']}{cap}{note}"]
    if report.backend:
        b = report.backend
        lines.append(f"Backend: {b['backend']} on {b['device']} ({b['reason']})")
    for err in report.errors:
        lines.append(f"ERROR: {err}")
    return "\n".join(lines)
