from __future__ import annotations

from deepinfer import plugins
from deepinfer_structured.xgrammar_backend import XGrammarBackend


def test_registered_and_available() -> None:
    assert plugins.grammars.load("xgrammar") is XGrammarBackend
    assert XGrammarBackend.availability().ok
