from __future__ import annotations

import pytest

from deepinfer.errors import InvalidRequestError
from deepinfer.sampling_params import MIN_TEMPERATURE, SamplingParams, StructuredOutputsParams


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"n": 0}, "n"),
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"min_p": 1.5}, "min_p"),
        ({"presence_penalty": 3.0}, "presence_penalty"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"seed": -1}, "seed"),
        ({"stop": [""]}, "stop"),
        ({"stop_token_ids": [-3]}, "stop_token_ids"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"min_tokens": 5, "max_tokens": 4}, "min_tokens"),
        ({"logprobs": 21}, "logprobs"),
        ({"n": True}, "n"),
        ({"logit_bias": {5: 101.0}}, "logit_bias"),
        ({"logit_bias": {-1: 1.0}}, "logit_bias"),
        ({"logit_bias": {5: True}}, "logit_bias"),
        ({"logit_bias": [5]}, "logit_bias"),
        ({"allowed_token_ids": []}, "allowed_token_ids"),
        ({"allowed_token_ids": [3, -2]}, "allowed_token_ids"),
        ({"truncate_prompt_tokens": 0}, "truncate_prompt_tokens"),
        ({"bad_words": ["  "]}, "bad_words"),
        ({"bad_words": "thee"}, "bad_words"),
    ],
)
def test_invalid_values_name_the_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidRequestError) as err:
        SamplingParams(**kwargs)  # type: ignore[arg-type]
    assert err.value.field == field
    assert str(err.value).startswith(f"{field}: ")


def test_defaults_and_normalisation() -> None:
    p = SamplingParams(stop="END", temperature=0)
    assert p.stop == ["END"] and p.greedy and p.max_tokens == 16
    # OpenAI's JSON logit_bias has string keys.
    assert SamplingParams.from_dict({"logit_bias": {"50": -100}}).logit_bias == {50: -100}


def test_aliases_and_unknown_keys() -> None:
    p = SamplingParams.from_dict({"max_new_tokens": 9, "sampling_seed": 3, "json_schema": {}})
    assert (p.max_tokens, p.seed) == (9, 3)
    assert p.structured_outputs is not None and p.structured_outputs.kind == "json"
    p = SamplingParams.from_dict({"ebnf": 'root ::= "a"'})
    assert p.structured_outputs is not None and p.structured_outputs.kind == "grammar"
    with pytest.raises(InvalidRequestError, match="unknown sampling parameter"):
        SamplingParams.from_dict({"temprature": 1.0})
    with pytest.raises(InvalidRequestError, match="given twice"):
        SamplingParams.from_dict({"max_tokens": 1, "max_new_tokens": 2})


def test_structured_outputs_need_exactly_one_constraint() -> None:
    with pytest.raises(InvalidRequestError, match="exactly one"):
        StructuredOutputsParams(regex="a+", grammar="root ::= x")
    with pytest.raises(InvalidRequestError, match="exactly one"):
        SamplingParams(structured_outputs={})  # type: ignore[arg-type]
    assert StructuredOutputsParams(choice=["yes", "no"]).kind == "choice"
    with pytest.raises(InvalidRequestError, match="unknown keys"):
        StructuredOutputsParams.from_dict({"yaml": "x"})


def test_a_vanishing_temperature_is_raised_to_the_lowest_that_samples() -> None:
    """Logits divided by 1.4e-45 (the least positive float32) overflow to inf: such a
    temperature is raised to 0.01, as vLLM does; 0 stays greedy, 0.01 and above are kept."""
    assert MIN_TEMPERATURE == 0.01
    assert SamplingParams(temperature=1.401298464324817e-45).temperature == 0.01
    assert SamplingParams(temperature=0.004).temperature == 0.01
    assert SamplingParams(temperature=0).temperature == 0.0
    assert SamplingParams(temperature=0.02).temperature == 0.02
