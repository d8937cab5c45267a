from __future__ import annotations

import pytest

from deepinfer import plugins
from deepinfer_structured.xgrammar_backend import XGrammarBackend


def test_registered_and_refuses_to_pretend() -> None:
    assert plugins.grammars.load("xgrammar") is XGrammarBackend
    assert not XGrammarBackend.availability().ok
    with pytest.raises(NotImplementedError, match="not implemented in deepinfer-structured"):
        XGrammarBackend()
