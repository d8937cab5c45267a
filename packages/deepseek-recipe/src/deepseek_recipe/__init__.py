"""Pure-Python DeepSeek-V4/V4.1 chat encoding and output parsing.

A drop-in for DeepSeek's official `deepseek-recipe` package: the Chat
Completions, OpenAI Responses and Anthropic Messages converters, with the same
class and method names, prompts, ids, stream events and error messages.
"""

from __future__ import annotations

from deepseek_recipe.__about__ import __version__
from deepseek_recipe.anthropic_messages import MessagesRequest
from deepseek_recipe.chat_stream import (
    ChatCompletionChunk,
    ChatCompletionChunkGenerator,
    ChatCompletionResponse,
)
from deepseek_recipe.conversation import Conversation
from deepseek_recipe.conversion import ChatCompletionRequest
from deepseek_recipe.encoding import DeepseekV4Encoding, DeepseekV41Encoding, RenderedPrompt
from deepseek_recipe.errors import CalcResizeError, ConversionError, ImageError
from deepseek_recipe.image_preprocess import OpenCvImagePreprocessor, PreprocessOptions
from deepseek_recipe.image_resolver import ImageQuota, ImageResolver, ReqwestImageFetcher
from deepseek_recipe.images import ImageInfo, MultiModalData
from deepseek_recipe.inference import InferenceChunk, InferenceFinishReason, PromptUsage
from deepseek_recipe.messages import (
    AssistantMessage,
    BytesImageSource,
    DataUrlImageSource,
    ImageSource,
    LatestReminderMessage,
    Message,
    SystemMessage,
    ToolCall,
    ToolDefinition,
    ToolMessage,
    UrlImageSource,
    UserMessage,
)
from deepseek_recipe.messages_stream import (
    MessagesChunkGenerator,
    MessagesResponse,
    MessagesStreamEvent,
)
from deepseek_recipe.options import (
    ConversionOptions,
    ModelVersion,
    ReasoningContentBehavior,
    WebSearchBehavior,
)
from deepseek_recipe.parsing_options import ParsingOptions, ThinkingInitialStage
from deepseek_recipe.request import ConversationRequest, InferenceOptions, OutputConstraint
from deepseek_recipe.responses import ResponsesRequest
from deepseek_recipe.responses_echo import ResponsesEcho
from deepseek_recipe.responses_stream import (
    ResponsesChunkGenerator,
    ResponsesResponse,
    ResponsesStreamEvent,
)
from deepseek_recipe.stream import StreamProcessor
from deepseek_recipe.tokenizer import Tokenizer
from deepseek_recipe.tokens import IMAGE_SPECIAL_TOKEN_ID, SpecialToken, SpecialTokens

__all__ = [
    "IMAGE_SPECIAL_TOKEN_ID",
    "AssistantMessage",
    "BytesImageSource",
    "CalcResizeError",
    "ChatCompletionChunk",
    "ChatCompletionChunkGenerator",
    "ChatCompletionRequest",
    "ChatCompletionResponse",
    "Conversation",
    "ConversationRequest",
    "ConversionError",
    "ConversionOptions",
    "DataUrlImageSource",
    "DeepseekV4Encoding",
    "DeepseekV41Encoding",
    "ImageError",
    "ImageInfo",
    "ImageQuota",
    "ImageResolver",
    "ImageSource",
    "InferenceChunk",
    "InferenceFinishReason",
    "InferenceOptions",
    "LatestReminderMessage",
    "Message",
    "MessagesChunkGenerator",
    "MessagesRequest",
    "MessagesResponse",
    "MessagesStreamEvent",
    "ModelVersion",
    "MultiModalData",
    "OpenCvImagePreprocessor",
    "OutputConstraint",
    "ParsingOptions",
    "PreprocessOptions",
    "PromptUsage",
    "ReasoningContentBehavior",
    "RenderedPrompt",
    "ReqwestImageFetcher",
    "ResponsesChunkGenerator",
    "ResponsesEcho",
    "ResponsesRequest",
    "ResponsesResponse",
    "ResponsesStreamEvent",
    "SpecialToken",
    "SpecialTokens",
    "StreamProcessor",
    "SystemMessage",
    "ThinkingInitialStage",
    "Tokenizer",
    "ToolCall",
    "ToolDefinition",
    "ToolMessage",
    "UrlImageSource",
    "UserMessage",
    "WebSearchBehavior",
    "__version__",
]
