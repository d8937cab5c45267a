"""Conversion options and the small enumerations the official API exposes."""

from __future__ import annotations

from enum import Enum

from deepseek_recipe.tokens import SpecialTokens


class _NamedEnum(Enum):
    """Enum whose repr is `Class.Member`, matching the official objects."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}.{self.name}"

    def __str__(self) -> str:
        return f"{type(self).__name__}.{self.name}"


class ModelVersion(_NamedEnum):
    """The model a converted conversation targets; it selects the prompt encoding."""

    DeepseekV4Pro = "DeepSeek-V4-Pro"
    DeepseekV41Flash = "DeepSeek-V4.1-Flash"


class ReasoningContentBehavior(_NamedEnum):
    """What to do with thinking-mode assistant history that lacks `reasoning_content`."""

    FillEmpty = "fill_empty"
    Reject = "reject"


class WebSearchBehavior(_NamedEnum):
    """Handling of web-search declarations in the Responses and Messages converters."""

    Drop = "drop"
    Reject = "reject"


DEFAULT_MAX_TOKENS_UPPER_BOUND = 393216


def _default_models() -> dict[str, ModelVersion]:
    return {
        "DeepSeek-V4-Pro": ModelVersion.DeepseekV4Pro,
        "DeepSeek-V4.1-Flash": ModelVersion.DeepseekV41Flash,
    }


class ConversionOptions:
    """Options for protocol request conversion.

    Instances are immutable; every `with_*` method returns a modified copy so one
    options object can be shared between concurrent requests.
    """

    def __init__(
        self,
        *,
        default_thinking_mode: bool = True,
        reasoning_content_behavior: ReasoningContentBehavior = ReasoningContentBehavior.FillEmpty,
        responses_web_search: WebSearchBehavior = WebSearchBehavior.Drop,
        messages_web_search: WebSearchBehavior = WebSearchBehavior.Reject,
        thinking_max_tokens_upper_bound: int = DEFAULT_MAX_TOKENS_UPPER_BOUND,
        non_thinking_max_tokens_upper_bound: int = DEFAULT_MAX_TOKENS_UPPER_BOUND,
    ) -> None:
        self._default_thinking_mode = default_thinking_mode
        self._reasoning_content_behavior = reasoning_content_behavior
        self._responses_web_search = responses_web_search
        self._messages_web_search = messages_web_search
        self._thinking_bound = thinking_max_tokens_upper_bound
        self._non_thinking_bound = non_thinking_max_tokens_upper_bound
        self._special_tokens = SpecialTokens()
        self._models = _default_models()

    def _copy(self) -> ConversionOptions:
        new = ConversionOptions.__new__(ConversionOptions)
        new.__dict__.update(self.__dict__)
        new._models = dict(self._models)
        return new

    @property
    def default_thinking_mode(self) -> bool:
        return self._default_thinking_mode

    @property
    def model_versions_by_name(self) -> dict[str, ModelVersion]:
        return dict(self._models)

    @property
    def thinking_max_tokens_upper_bound(self) -> int:
        return self._thinking_bound

    @property
    def non_thinking_max_tokens_upper_bound(self) -> int:
        return self._non_thinking_bound

    @property
    def reasoning_content_behavior(self) -> ReasoningContentBehavior:
        return self._reasoning_content_behavior

    @property
    def responses_web_search(self) -> WebSearchBehavior:
        return self._responses_web_search

    @property
    def messages_web_search(self) -> WebSearchBehavior:
        return self._messages_web_search

    @property
    def special_tokens(self) -> SpecialTokens:
        return self._special_tokens

    def with_default_thinking_mode(self, default_thinking_mode: bool) -> ConversionOptions:
        new = self._copy()
        new._default_thinking_mode = default_thinking_mode
        return new

    def with_reasoning_content_behavior(
        self, reasoning_content_behavior: ReasoningContentBehavior
    ) -> ConversionOptions:
        new = self._copy()
        new._reasoning_content_behavior = reasoning_content_behavior
        return new

    def with_responses_web_search(
        self, responses_web_search: WebSearchBehavior
    ) -> ConversionOptions:
        new = self._copy()
        new._responses_web_search = responses_web_search
        return new

    def with_messages_web_search(self, messages_web_search: WebSearchBehavior) -> ConversionOptions:
        new = self._copy()
        new._messages_web_search = messages_web_search
        return new

    def with_special_tokens(self, special_tokens: SpecialTokens) -> ConversionOptions:
        new = self._copy()
        new._special_tokens = special_tokens
        return new

    def with_model_alias(self, model: str, model_version: ModelVersion) -> ConversionOptions:
        """Accept `model` as a name of `model_version` (adds it or replaces its version)."""
        new = self._copy()
        new._models[model] = model_version
        return new

    def with_model_versions_by_name(
        self, model_versions_by_name: dict[str, ModelVersion]
    ) -> ConversionOptions:
        """Replace the whole table of accepted model names."""
        new = self._copy()
        new._models = dict(model_versions_by_name)
        return new

    def with_thinking_max_tokens_upper_bound(
        self, thinking_max_tokens_upper_bound: int
    ) -> ConversionOptions:
        new = self._copy()
        new._thinking_bound = thinking_max_tokens_upper_bound
        return new

    def with_non_thinking_max_tokens_upper_bound(
        self, non_thinking_max_tokens_upper_bound: int
    ) -> ConversionOptions:
        new = self._copy()
        new._non_thinking_bound = non_thinking_max_tokens_upper_bound
        return new
