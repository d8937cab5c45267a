"""Sampling parameters, with vLLM/OpenAI names, validated when the request is submitted.

Validation lives here, not in the sampler, so a bad request fails alone at submit time with the
field and the reason, and never reaches a batch it could take down.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from deepinfer.checks import is_int, is_number
from deepinfer.errors import InvalidRequestError

#: SGLang / OpenAI spellings accepted by :meth:`SamplingParams.from_dict`.
ALIASES: dict[str, str] = {
    "max_new_tokens": "max_tokens",
    "min_new_tokens": "min_tokens",
    "sampling_seed": "seed",
    "max_completion_tokens": "max_tokens",
}
STRUCTURED_KINDS: tuple[str, ...] = ("json", "json_object", "regex", "grammar", "choice")
STRUCTURED_ALIASES: dict[str, str] = {"json_schema": "json", "ebnf": "grammar"}


#: The lowest temperature that samples (vLLM's ``_MAX_TEMP``): a smaller positive one is
#: raised to it, since logits divided by it overflow to inf and the softmax to NaN.
MIN_TEMPERATURE = 1e-2


@dataclass(frozen=True)
class StructuredOutputsParams:
    """Exactly one output constraint: a JSON schema, any JSON object, a regex, EBNF or choices."""

    json: str | dict[str, Any] | None = None
    json_object: bool | None = None
    regex: str | None = None
    grammar: str | None = None
    choice: list[str] | None = None

    def _set(self) -> list[str]:
        # json may legitimately be the boolean schema False; json_object is a flag.
        return [
            k
            for k in STRUCTURED_KINDS
            if getattr(self, k) is not None and (k != "json_object" or getattr(self, k))
        ]

    def __post_init__(self) -> None:
        for name, types, what in (
            ("json", (str, dict, bool), "a JSON schema (dict, JSON text or a boolean schema)"),
            ("json_object", (bool,), "a boolean"),
            ("regex", (str,), "a string"),
            ("grammar", (str,), "a string"),
            ("choice", (list, tuple), "a list of strings"),
        ):
            value = getattr(self, name)
            if value is not None and not isinstance(value, types):
                raise InvalidRequestError(
                    f"structured_outputs.{name}", f"must be {what}, got {type(value).__name__}"
                )
        if isinstance(self.choice, tuple):
            object.__setattr__(self, "choice", list(self.choice))
        chosen = self._set()
        if len(chosen) != 1:
            raise InvalidRequestError(
                "structured_outputs",
                f"set exactly one of {', '.join(STRUCTURED_KINDS)} (got {chosen or 'none'})",
            )
        if self.choice is not None and (
            not self.choice or not all(isinstance(c, str) and c for c in self.choice)
        ):
            raise InvalidRequestError("structured_outputs.choice", "must be non-empty strings")

    @property
    def kind(self) -> str:
        return self._set()[0]

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StructuredOutputsParams:
        if not isinstance(data, Mapping):
            raise InvalidRequestError(
                "structured_outputs",
                f"must be StructuredOutputsParams or a dict, got {type(data).__name__}",
            )
        names = {STRUCTURED_ALIASES.get(k, k): v for k, v in data.items() if isinstance(k, str)}
        unknown = sorted(
            str(k) for k in data if STRUCTURED_ALIASES.get(k, k) not in STRUCTURED_KINDS
        )
        if unknown:
            raise InvalidRequestError("structured_outputs", f"unknown keys {unknown}")
        return cls(**names)


#: Most alternatives ``logprobs`` / ``prompt_logprobs`` may ask for (OpenAI's limit).
MAX_LOGPROBS = 20
_FLOAT_FIELDS = (
    "temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty",
)  # fmt: skip


def _token_key(key: object) -> object:
    """A ``logit_bias`` key as a token id: OpenAI's JSON sends ``{"50256": -100}``."""
    if isinstance(key, str) and key.strip().isascii() and key.strip().isdigit():
        return int(key)
    return key


@dataclass
class SamplingParams:
    """How to sample one request. ``temperature=0`` is greedy (above 0 it is at least
    :data:`MIN_TEMPERATURE`); ``top_k`` 0 or -1 disables it."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    max_tokens: int | None = 16
    min_tokens: int = 0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True
    structured_outputs: StructuredOutputsParams | None = None
    #: OpenAI's ``logit_bias``: token id -> value in [-100, 100] added to its logit before
    #: penalties and sampling (greedy too); the reported logprobs stay the model's.
    logit_bias: dict[int, float] | None = None
    #: Only these tokens may be generated (vLLM's ``allowed_token_ids``).
    allowed_token_ids: list[int] | None = None
    #: Words never to generate (vLLM's ``bad_words``): each is tokenized as is and after a
    #: space, and the last token of such a sequence is banned wherever it would complete it.
    bad_words: list[str] | None = None
    #: Keep only the last k prompt tokens (vLLM's ``truncate_prompt_tokens``): a long
    #: conversation still fits ``max_model_len``.
    truncate_prompt_tokens: int | None = None

    def __post_init__(self) -> None:
        self.validate()

    @property
    def penalized(self) -> bool:
        """Whether a penalty changes the logits (it reads every token generated so far)."""
        return bool(self.presence_penalty or self.frequency_penalty) or (
            self.repetition_penalty != 1
        )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def validate(self) -> None:
        """Check every field's type and range and normalise the accepted spellings.

        Runs at construction and again when the engine takes the request: the dataclass is
        mutable, and a field set afterwards must not reach a step unchecked. Idempotent.
        """
        self._check_types()
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        for name in ("stop", "stop_token_ids"):
            value = getattr(self, name)
            setattr(self, name, [] if value is None else list(value))
        for name in ("allowed_token_ids", "bad_words"):
            if isinstance(getattr(self, name), tuple):
                setattr(self, name, list(getattr(self, name)))
        if isinstance(self.logit_bias, Mapping):  # JSON object keys arrive as strings
            self.logit_bias = {_token_key(k): v for k, v in self.logit_bias.items()}
        if isinstance(self.structured_outputs, Mapping):
            self.structured_outputs = StructuredOutputsParams.from_dict(self.structured_outputs)
        self._check_values()
        for name in _FLOAT_FIELDS:  # ints are accepted; the sampler computes in floats
            setattr(self, name, float(getattr(self, name)))
        if 0.0 < self.temperature < MIN_TEMPERATURE:  # logits / t would overflow to inf
            self.temperature = MIN_TEMPERATURE
        if self.logit_bias is not None:
            self.logit_bias = {t: float(v) for t, v in self.logit_bias.items()}

    def _check_types(self) -> None:
        """Each field's type, before any value is compared: a wrong type is reported with the
        field's name instead of failing inside a comparison or a step."""

        def bad(name: str, expected: str) -> None:
            value = getattr(self, name)
            raise InvalidRequestError(
                name, f"must be {expected}, got {type(value).__name__} {value!r:.80}"
            )

        for name in _FLOAT_FIELDS:
            if not is_number(getattr(self, name)):
                bad(name, "a number")
        for name in ("n", "top_k", "min_tokens"):
            if not is_int(getattr(self, name)):
                bad(name, "an integer")
        for name in ("seed", "max_tokens", "logprobs", "prompt_logprobs", "truncate_prompt_tokens"):
            value = getattr(self, name)
            if value is not None and not is_int(value):
                bad(name, "None or an integer")
        for name in ("include_stop_str_in_output", "ignore_eos", "skip_special_tokens"):
            if not isinstance(getattr(self, name), bool):
                bad(name, "a boolean")
        if not (
            self.stop is None
            or isinstance(self.stop, str)
            or (isinstance(self.stop, (list, tuple)) and all(isinstance(s, str) for s in self.stop))
        ):
            bad("stop", "a string or a list of strings")
        for name in ("stop_token_ids", "allowed_token_ids"):
            value = getattr(self, name)
            if value is not None and not (
                isinstance(value, (list, tuple)) and all(is_int(t) for t in value)
            ):
                bad(name, "a list of integer token ids")
        if self.bad_words is not None and not (
            isinstance(self.bad_words, (list, tuple))
            and all(isinstance(w, str) for w in self.bad_words)
        ):
            bad("bad_words", "a list of strings")
        if self.logit_bias is not None and not (
            isinstance(self.logit_bias, Mapping)
            and all(is_int(_token_key(k)) for k in self.logit_bias)
            and all(is_number(v) for v in self.logit_bias.values())
        ):
            bad("logit_bias", "a dict of integer token ids (or their strings) to numbers")
        if self.structured_outputs is not None and not isinstance(
            self.structured_outputs, (StructuredOutputsParams, Mapping)
        ):
            bad("structured_outputs", "StructuredOutputsParams or a dict")

    def _check_values(self) -> None:
        """Ranges, once every field has its type."""

        def bad(name: str, reason: str) -> None:
            raise InvalidRequestError(name, f"{reason}, got {getattr(self, name)!r:.80}")

        if self.n < 1:
            bad("n", "must be an integer >= 1")
        if not 0.0 <= self.temperature < float("inf"):
            bad("temperature", "must be finite and >= 0")
        if not 0.0 < self.top_p <= 1.0:
            bad("top_p", "must be in (0, 1]")
        if self.top_k < -1:
            bad("top_k", "must be -1, 0 (disabled) or a positive integer")
        if not 0.0 <= self.min_p <= 1.0:
            bad("min_p", "must be in [0, 1]")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                bad(name, "must be in [-2, 2]")
        if not 0.0 < self.repetition_penalty <= 10.0:
            bad("repetition_penalty", "must be in (0, 10]")
        if self.seed is not None and not 0 <= self.seed < 2**63:
            bad("seed", "must be an integer in [0, 2**63)")
        if not all(self.stop):
            bad("stop", "must be non-empty strings")
        if not all(t >= 0 for t in self.stop_token_ids):
            bad("stop_token_ids", "must be non-negative integers")
        if self.max_tokens is not None and self.max_tokens < 1:
            bad("max_tokens", "must be None or an integer >= 1")
        if self.min_tokens < 0:
            bad("min_tokens", "must be an integer >= 0")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            bad("min_tokens", f"must not exceed max_tokens ({self.max_tokens})")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and not 0 <= value <= MAX_LOGPROBS:
                bad(name, f"must be None or an integer in [0, {MAX_LOGPROBS}]")
        if self.logit_bias is not None and not (
            all(t >= 0 for t in self.logit_bias)
            and all(-100 <= v <= 100 for v in self.logit_bias.values())
        ):
            bad("logit_bias", "must map non-negative token ids to numbers in [-100, 100]")
        if self.bad_words is not None and not all(w.strip() for w in self.bad_words):
            bad("bad_words", "must be a list of strings with some non-space text")
        if self.truncate_prompt_tokens is not None and self.truncate_prompt_tokens < 1:
            bad("truncate_prompt_tokens", "must be None or an integer >= 1")
        if self.allowed_token_ids is not None and not (
            self.allowed_token_ids and all(t >= 0 for t in self.allowed_token_ids)
        ):
            bad("allowed_token_ids", "must be a non-empty list of non-negative token ids")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SamplingParams:
        """Build from a JSON-like dict, accepting SGLang/OpenAI aliases; unknown keys fail."""
        if not isinstance(data, Mapping):
            raise InvalidRequestError(
                "sampling_params", f"must be a dict, got {type(data).__name__}"
            )
        known = {f.name for f in fields(cls)}
        kwargs: dict[str, Any] = {}
        structured: dict[str, Any] = {}
        for key, value in data.items():
            if not isinstance(key, str):
                raise InvalidRequestError(str(key), "unknown sampling parameter")
            if key in STRUCTURED_ALIASES or key == "regex":
                structured[STRUCTURED_ALIASES.get(key, key)] = value
                continue
            name = ALIASES.get(key, key)
            if name not in known:
                raise InvalidRequestError(key, "unknown sampling parameter")
            if name in kwargs:
                raise InvalidRequestError(key, f"given twice (also as '{name}')")
            kwargs[name] = value
        if structured:
            if "structured_outputs" in kwargs:
                raise InvalidRequestError("structured_outputs", "given twice")
            kwargs["structured_outputs"] = structured
        return cls(**kwargs)
