from __future__ import annotations

import pytest

from deepinfer import plugins
from deepinfer_spec.speculators import DSparkSpeculator, MTPSpeculator


@pytest.mark.parametrize(("name", "cls"), [("dspark", DSparkSpeculator), ("mtp", MTPSpeculator)])
def test_registered_and_refuses_to_pretend(name: str, cls: type) -> None:
    assert plugins.speculators.load(name) is cls
    assert not cls.availability().ok
    with pytest.raises(NotImplementedError, match="not implemented in deepinfer-spec"):
        cls()
