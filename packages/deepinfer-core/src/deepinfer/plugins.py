"""Plugin registries over entry points.

DeepInfer's packages find each other only through entry points, so a deployment installs just the
hardware backend it needs and core never imports a plugin by name. Discovery reads installed
metadata and imports nothing; a plugin is imported the first time it is asked for. Core registers
its own ``torch`` backend through the same mechanism, so there is exactly one path for every plugin.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from deepinfer.errors import PluginConflictError, PluginLoadError, PluginNotFoundError


@dataclass(frozen=True)
class Availability:
    """Whether a plugin can run on this machine, and if not, why (shown by ``deepinfer info``).

    Every plugin object may expose it as an ``availability()`` classmethod, answered without
    building the plugin.
    """

    ok: bool
    reason: str = ""


@dataclass(frozen=True)
class PluginInfo:
    """One registered plugin as the metadata describes it (nothing imported)."""

    name: str
    value: str
    distribution: str
    version: str

    @property
    def source(self) -> str:
        return f"{self.distribution} {self.version} ({self.value})"


class Registry:
    """Lazily loaded plugins of one entry-point group.

    ``hints`` maps a plugin name to the pip requirement that installs it, so a missing plugin is
    answered with the command that fixes it rather than a bare KeyError.
    """

    def __init__(self, group: str, kind: str, hints: Mapping[str, str] | None = None) -> None:
        self.group = group
        self.kind = kind
        self.hints = dict(hints or {})
        self._entry_points: dict[str, metadata.EntryPoint] | None = None
        self._infos: dict[str, PluginInfo] = {}
        self._loaded: dict[str, Any] = {}

    def cache_clear(self) -> None:
        """Forget discovery and loads (metadata on sys.path changed, e.g. in tests)."""
        self._entry_points = None
        self._infos = {}
        self._loaded = {}

    def _discover(self) -> dict[str, metadata.EntryPoint]:
        if self._entry_points is not None:
            return self._entry_points
        found: dict[str, metadata.EntryPoint] = {}
        infos: dict[str, PluginInfo] = {}
        for ep in metadata.entry_points(group=self.group):
            dist = ep.dist
            info = PluginInfo(
                name=ep.name,
                value=ep.value,
                distribution=dist.metadata["Name"] if dist is not None else "<unknown>",
                version=dist.version if dist is not None else "?",
            )
            if ep.name in infos:
                first = infos[ep.name]
                if (first.distribution, first.value) == (info.distribution, info.value):
                    continue  # the same distribution seen twice on sys.path: first one wins
                raise PluginConflictError(
                    f"{self.kind} '{ep.name}' is registered twice in '{self.group}': "
                    f"by {first.source} and by {info.source}; uninstall one of them"
                )
            found[ep.name] = ep
            infos[ep.name] = info
        self._entry_points, self._infos = found, infos
        return found

    def names(self) -> list[str]:
        return sorted(self._discover())

    def infos(self) -> list[PluginInfo]:
        self._discover()
        return [self._infos[n] for n in sorted(self._infos)]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self._discover()

    def missing_error(self, name: str) -> PluginNotFoundError:
        installed = ", ".join(self.names()) or "none"
        hint = self.hints.get(name)
        how = (
            f": pip install '{hint}'"
            if hint
            else " and no DeepInfer extra provides it (check the spelling)"
        )
        return PluginNotFoundError(
            f"{self.kind} '{name}' is not installed{how} (installed {self.kind}s: {installed})"
        )

    def load(self, name: str) -> Any:
        """Import and return the object registered as ``name``; cached per process."""
        if name in self._loaded:
            return self._loaded[name]
        eps = self._discover()
        if name not in eps:
            raise self.missing_error(name)
        try:
            obj = eps[name].load()
        except Exception as exc:
            raise PluginLoadError(
                f"{self.kind} '{name}' from {self._infos[name].source} failed to import: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        self._loaded[name] = obj
        return obj


backends = Registry(
    "deepinfer.backends",
    "backend",
    {"sm100": "deepinfer[sm100]", "ascend": "deepinfer[ascend]"},
)
speculators = Registry(
    "deepinfer.speculators",
    "speculator",
    {"dspark": "deepinfer[spec]", "mtp": "deepinfer[spec]"},
)
grammars = Registry(
    "deepinfer.grammars",
    "grammar backend",
    {name: "deepinfer[structured]" for name in ("auto", "xgrammar", "llguidance")},
)
models = Registry("deepinfer.models", "model", {})

REGISTRIES: tuple[Registry, ...] = (backends, speculators, grammars, models)
