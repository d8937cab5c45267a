"""The conversion settings a history builder reads, taken from the options the same way.

Every protocol's history needs the model version, whether thinking is on,
whether missing reasoning is rejected, how an image is spelled and whether the
request offers tools; Anthropic Messages adds two settings of its own.
"""

from __future__ import annotations

from dataclasses import dataclass

from deepseek_recipe.options import ConversionOptions, ModelVersion, ReasoningContentBehavior


@dataclass
class HistoryOptions:
    version: ModelVersion
    thinking: bool
    reject_missing_reasoning: bool
    image_token: str
    has_tools: bool = False
    #: Messages: drop server-tool blocks (web search) instead of rejecting them.
    drop_server_blocks: bool = False
    #: Messages: the declared tools that a `tool_reference` or `tool_addition` block may name.
    tool_names: frozenset[str] = frozenset()

    @classmethod
    def from_conversion(
        cls,
        version: ModelVersion,
        thinking: bool,
        options: ConversionOptions,
        *,
        has_tools: bool,
        drop_server_blocks: bool = False,
        tool_names: frozenset[str] = frozenset(),
    ) -> HistoryOptions:
        """The settings of one conversion."""
        return cls(
            version=version,
            thinking=thinking,
            reject_missing_reasoning=(
                options.reasoning_content_behavior is ReasoningContentBehavior.Reject
            ),
            image_token=options.special_tokens.get("image"),
            has_tools=has_tools,
            drop_server_blocks=drop_server_blocks,
            tool_names=tool_names,
        )
