from __future__ import annotations

from deepinfer import plugins
from deepinfer_structured.auto_backend import AutoBackend
from deepinfer_structured.llguidance_backend import LLGuidanceBackend
from deepinfer_structured.xgrammar_backend import XGrammarBackend


def test_registered_and_available() -> None:
    for name, cls in (
        ("xgrammar", XGrammarBackend),
        ("llguidance", LLGuidanceBackend),
        ("auto", AutoBackend),
    ):
        assert plugins.grammars.load(name) is cls
        assert cls.availability().ok
        assert cls.name == name


def test_the_engine_loads_the_configured_backend(make_engine) -> None:  # type: ignore[no-untyped-def]
    assert isinstance(make_engine().grammar_backend(), AutoBackend)  # the default
    engine = make_engine(structured_outputs_backend="llguidance")
    assert isinstance(engine.grammar_backend(), LLGuidanceBackend)
