"""The op table is an explicit interface: every op is a public abstract method of ``Backend``,
the torch reference implements all of them, and hardware backends override public ops only
(a private override would change the reference's behaviour behind the table's back)."""

from __future__ import annotations

import inspect

import pytest

from deepinfer import plugins
from deepinfer.backends.base import Backend
from deepinfer.backends.torch_ref import TorchBackend
from deepinfer.errors import PluginLoadError


def test_every_op_is_public_and_abstract() -> None:
    ops = Backend.__abstractmethods__
    assert "availability" in ops and "linear" in ops and "hc_mix" in ops
    assert all(not name.startswith("_") for name in ops)
    assert not TorchBackend.__abstractmethods__  # the reference implements every op


@pytest.mark.parametrize("name", plugins.backends.names())
def test_backends_override_public_ops_only(name: str) -> None:
    try:
        cls = plugins.backends.load(name)
    except PluginLoadError as exc:  # a plugin whose SDK is absent still registers
        pytest.skip(str(exc))
    assert issubclass(cls, TorchBackend)
    reference = set(inspect.getmro(TorchBackend))
    for klass in inspect.getmro(cls):  # the backend's classes and mixins, not the reference's
        if klass in reference:
            continue
        for attr in vars(klass):
            inherited = hasattr(TorchBackend, attr)
            private = attr.startswith("_") and not attr.startswith("__") and attr != "_abc_impl"
            assert not (inherited and private), f"{klass.__name__} overrides private {attr}"
