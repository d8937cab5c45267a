"""The converted request: conversation, inference options, parsing options."""

from __future__ import annotations

from dataclasses import dataclass

from deepseek_recipe.conversation import Conversation
from deepseek_recipe.errors import ConversionError
from deepseek_recipe.options import ModelVersion
from deepseek_recipe.parsing_options import ParsingOptions
from deepseek_recipe.reprs import rust_str as _rust_str

NON_THINKING_DEFAULT_MAX_TOKENS = 8192
THINKING_DEFAULT_MAX_TOKENS = 65536
THINKING_MAX_EFFORT_DEFAULT_MAX_TOKENS = 131072


@dataclass(frozen=True)
class OutputConstraint:
    """A constraint the backend may enforce by constrained decoding.

    `kind` is `json`, `regex`, `tool_call` or `tool_call_required`; `schema` is
    compact JSON, the regular expression, the tool list, or `""` for any JSON.
    """

    kind: str
    schema: str

    def __repr__(self) -> str:
        return f"OutputConstraint(kind={_rust_str(self.kind)}, schema={_rust_str(self.schema)})"


@dataclass(frozen=True)
class InferenceOptions:
    """Sampling parameters resolved by conversion (`None` = caller's default)."""

    max_tokens: int | None = None
    temperature: float | None = 1.0
    top_p: float | None = 1.0
    logprobs: bool = False
    top_logprobs: int | None = None
    seed: int | None = None
    output_constraint: OutputConstraint | None = None


class ConversationRequest:
    """A conversation with its inference and parsing options and target model."""

    def __init__(
        self,
        conversation: Conversation,
        model_version: ModelVersion,
        *,
        inference_options: InferenceOptions | None = None,
        parsing_options: ParsingOptions | None = None,
        stream: bool = False,
    ) -> None:
        self._conversation = conversation
        self._model_version = model_version
        self._inference_options = inference_options or InferenceOptions()
        self._parsing_options = parsing_options or ParsingOptions()
        self._stream = stream

    @property
    def conversation(self) -> Conversation:
        return self._conversation

    @property
    def inference_options(self) -> InferenceOptions:
        return self._inference_options

    @property
    def parsing_options(self) -> ParsingOptions:
        return self._parsing_options

    @property
    def model_version(self) -> ModelVersion:
        return self._model_version

    @property
    def stream(self) -> bool:
        return self._stream

    def resolve_max_tokens(self, prompt_tokens: int, context_limit: int) -> int:
        """Resolve the `max_tokens` to send to the backend.

        A requested value is kept; otherwise the mode default applies.  The result
        is lowered to the context left after the prompt and raised to at least 1.
        """
        if prompt_tokens < 0 or context_limit < 0:
            raise OverflowError("out of range integral type conversion attempted")
        requested = self._inference_options.max_tokens
        completion = 0 if requested is None else requested
        if prompt_tokens + completion > context_limit:
            raise ConversionError(
                f"This model's maximum context length is {context_limit} tokens. However, you "
                "requested "
                f"{prompt_tokens + completion} tokens ({prompt_tokens} in the messages, "
                f"{completion} in the "
                "completion). Please reduce the length of the messages or completion."
            )
        if requested is None:
            conv = self._conversation
            if not conv.thinking_mode:
                requested = NON_THINKING_DEFAULT_MAX_TOKENS
            elif conv.reasoning_effort == "max":
                requested = THINKING_MAX_EFFORT_DEFAULT_MAX_TOKENS
            else:
                requested = THINKING_DEFAULT_MAX_TOKENS
        return max(1, min(requested, context_limit - prompt_tokens))
