from __future__ import annotations

import sys
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from deepinfer import plugins
from deepinfer.errors import PluginConflictError, PluginLoadError, PluginNotFoundError
from deepinfer.plugins import Registry

FakeDist = Callable[..., Path]  # the fake_dist fixture (tests/conftest.py)


def _unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


def test_discovery_reads_metadata_and_loads_lazily(fake_dist: FakeDist) -> None:
    module = _unique("fake_backend_mod")
    fake_dist(
        "fake-backend",
        {"deepinfer.backends": {"fakebk": f"{module}:FakeBackend"}},
        modules={module: "class FakeBackend:\n    marker = 42\n"},
        version="2.3.4",
    )
    reg = Registry("deepinfer.backends", "backend")
    assert "fakebk" in reg.names()
    # The installed core registers its own reference backend through the same group.
    assert "torch" in reg.names()
    info = {i.name: i for i in reg.infos()}["fakebk"]
    assert (info.distribution, info.version, info.value) == (
        "fake-backend",
        "2.3.4",
        f"{module}:FakeBackend",
    )
    assert module not in sys.modules, "discovery must not import plugins"
    cls = reg.load("fakebk")
    assert module in sys.modules
    assert cls.marker == 42
    assert reg.load("fakebk") is cls


def test_duplicate_names_rejected_with_both_sources(fake_dist: FakeDist) -> None:
    group = _unique("deepinfer.testgroup")
    fake_dist("alpha-plugin", {group: {"dup": "alpha_mod:A"}})
    fake_dist("beta-plugin", {group: {"dup": "beta_mod:B"}})
    reg = Registry(group, "speculator")
    with pytest.raises(PluginConflictError) as err:
        reg.names()
    msg = str(err.value)
    assert "speculator 'dup' is registered twice" in msg
    assert "alpha-plugin 1.0 (alpha_mod:A)" in msg
    assert "beta-plugin 1.0 (beta_mod:B)" in msg


def test_duplicate_of_an_installed_plugin_names_both(fake_dist: FakeDist) -> None:
    fake_dist("rogue-backend", {"deepinfer.backends": {"torch": "rogue:Torch"}})
    with pytest.raises(PluginConflictError) as err:
        Registry("deepinfer.backends", "backend").load("torch")
    assert "deepinfer-core" in str(err.value)
    assert "rogue-backend" in str(err.value)


def test_same_distribution_twice_on_path_is_not_a_conflict(fake_dist: FakeDist) -> None:
    group = _unique("deepinfer.testgroup")
    fake_dist("twin-plugin", {group: {"one": "twin_mod:X"}})
    fake_dist("twin-plugin", {group: {"one": "twin_mod:X"}})
    assert Registry(group, "backend").names() == ["one"]


@pytest.mark.parametrize(
    ("registry", "name", "extra"),
    [
        (plugins.backends, "sm100", "deepinfer[sm100]"),
        (plugins.backends, "ascend", "deepinfer[ascend]"),
        (plugins.speculators, "dspark", "deepinfer[spec]"),
        (plugins.grammars, "xgrammar", "deepinfer[structured]"),
    ],
)
def test_missing_plugin_names_the_extra(registry: Registry, name: str, extra: str) -> None:
    # An empty group stands for a deployment where the plugin's package is not installed.
    empty = Registry(_unique("deepinfer.empty"), registry.kind, registry.hints)
    with pytest.raises(PluginNotFoundError) as err:
        empty.load(name)
    assert str(err.value) == (
        f"{registry.kind} '{name}' is not installed: pip install '{extra}' "
        f"(installed {registry.kind}s: none)"
    )
    assert isinstance(err.value, LookupError)


def test_unknown_name_says_no_extra_provides_it() -> None:
    with pytest.raises(PluginNotFoundError, match="no DeepInfer extra provides it"):
        plugins.backends.load("tpu-v9")


def test_broken_plugin_reports_its_source_and_cause(fake_dist: FakeDist) -> None:
    group = _unique("deepinfer.testgroup")
    module = _unique("broken_mod")
    fake_dist(
        "broken-plugin",
        {group: {"broken": f"{module}:Thing"}},
        modules={module: "raise OSError('libhccl.so: cannot open shared object file')\n"},
    )
    reg = Registry(group, "backend")
    assert reg.names() == ["broken"]
    with pytest.raises(PluginLoadError) as err:
        reg.load("broken")
    assert "broken-plugin 1.0" in str(err.value)
    assert "libhccl.so" in str(err.value)
