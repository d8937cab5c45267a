"""Responses tool search items in the history (V4.1 deferred tool loading).

A client-executed tool search is a round trip through the caller: the model
calls `tool_search`, the caller answers with a `tool_search_output` listing the
tools it found, and those tools are offered from then on.  In the prompt the
call is an ordinary tool call, the output an ordinary tool result (the found
declarations as JSON), and the found tools are announced by a system message
after the results (see `deferred_tools`).  V4 has no deferred loading, so its
history leaves the whole exchange out.
"""

from __future__ import annotations

from typing import Any

from deepseek_recipe import serde_decode as s
from deepseek_recipe.errors import ConversionError
from deepseek_recipe.messages import ToolCall
from deepseek_recipe.options import ModelVersion
from deepseek_recipe.protocol_json import dumps
from deepseek_recipe.responses_tools import (
    TOOL_SEARCH,
    DeclaredTools,
    check_declaration,
    echo_tool,
    map_declarations,
)


def search_call(item: dict[str, Any]) -> ToolCall:
    """A `tool_search_call` item as the call the model made."""
    return ToolCall(item["call_id"], TOOL_SEARCH, dumps(item["arguments"]))


def _listed(tool: Any, index: int) -> list[dict[str, Any]]:
    """A found tool as the tool result lists it; a namespace lists its functions."""
    if tool is s.UNSUPPORTED:
        raise ConversionError(
            f"input[{index}]: the enum variant ResponsesTool::Unsupported cannot be serialized"
        )
    if tool["type"] != "namespace":
        return [echo_tool(tool)]
    space = {"name": tool["name"], "description": tool["description"] or ""}
    return [{**echo_tool(inner), "namespace": space} for inner in tool["tools"]]


class ToolSearchLoader:
    """Collects the tools that the tool search outputs of one history load, in order."""

    def __init__(self, declared: DeclaredTools, reject_web_search: bool) -> None:
        self.loaded = DeclaredTools()
        self._taken = {t.name for t in declared.tools}
        self._reject_web_search = reject_web_search

    def check(self, index: int, tools: list[Any]) -> None:
        """The declaration checks of the found tools, reported at their input location."""
        for j, tool in enumerate(tools):
            check_declaration(
                f"input[{index}].tools[{j}]",
                tool,
                custom=True,
                reject_web_search=self._reject_web_search,
            )

    def result_text(self, index: int, tools: list[Any]) -> str:
        """The tool result: the found declarations as compact JSON."""
        return dumps([entry for tool in tools for entry in _listed(tool, index)])

    def load(self, tools: list[Any]) -> list[str]:
        """Offer the found tools as deferred tools; their prompt names, in order."""
        found = map_declarations(
            tools, ModelVersion.DeepseekV41Flash, taken=self._taken, deferred=True
        )
        self.loaded.extend(found)
        names = [t.name for t in found.tools]
        self._taken.update(names)
        return names
