"""Fixed prompt texts: effort prefixes, the tools block and the format blocks.

Each text is a list of pieces so that control tokens mentioned inside the
instructions (the DSML prefix, `<think>`, `</think>`) stay special tokens when
the prompt is encoded, exactly as in the official encoding.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from deepseek_recipe.messages import ToolDefinition
from deepseek_recipe.pieces import Piece, special, text
from deepseek_recipe.pyjson import dumps_python
from deepseek_recipe.tokens import SpecialTokens

V4_EFFORT_HIGH = (
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to "
    "resolve the root "
    "cause, rigorously stress-testing your logic against all potential paths, edge cases, and "
    "adversarial "
    "scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate "
    "step, considered "
    "alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n\n"
)

V4_EFFORT_MAX = (
    "Reasoning Effort: Beyond maximum \u2014 exhaustive, relentless, and uncompromising.\n"
    "You MUST reason with the utmost depth and rigor, leaving absolutely nothing to chance: "
    "exhaustively "
    "decompose the problem into its most fundamental components, trace every causal chain to "
    "its root, and "
    "resolve the underlying cause rather than any surface symptom.\n"
    "Do not stop reasoning until you have independently verified the solution from multiple "
    "angles and are "
    "certain that no assumption remains unchecked and no error remains undiscovered.\n\n"
)

V41_EFFORT_VALUES = {"low": 50, "high": 75, "xhigh": 75, "max": 100}

V4_JSON_OBJECT_FORMAT = (
    "You are a helpful assistant designed to output JSON.\n## Response Format:\n\n"
    "Reply with JSON object ONLY."
)
SCHEMA_FORMAT_HEADER = (
    "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n"
)


def v4_effort_prefix(effort: str | None) -> str:
    if effort == "low":
        return ""
    if effort == "max":
        return V4_EFFORT_MAX
    return V4_EFFORT_HIGH


def v41_effort_prefix(effort: str | None) -> str:
    value = V41_EFFORT_VALUES.get(effort or "high", 75)
    return (
        f"Reasoning Effort: {value} (range 1-100, the higher the value, "
        "the more thorough the reasoning)\n\n"
    )


UPDATED_TOOLS_HEADER = "\n\n### Updated Tool Schemas\n\n"


def tool_schema_line(tool: ToolDefinition, flavor: Any) -> str:
    """One tool as the prompt lists it: name, description (empty when absent), parameters."""
    return dumps_python(
        {"name": tool.name, "description": tool.description or "", "parameters": tool.parameters},
        flavor.float_format,
    )


def updated_tools_text(tools: Sequence[ToolDefinition], flavor: Any) -> str:
    """The schemas a mid-conversation system message makes available, after its content.

    Deferred tools stay out of the opening tools block; this is how the model
    learns them once they are loaded.
    """
    return UPDATED_TOOLS_HEADER + "\n".join(tool_schema_line(t, flavor) for t in tools)


def tools_block(tools: Sequence[ToolDefinition], tokens: SpecialTokens, flavor: Any) -> list[Piece]:
    """The "## Tools" instructions followed by one JSON line per tool that is not deferred.

    The block stays even when every tool is deferred; its schema list is then
    empty, which shows that V4 ends each schema line with a newline while V4.1
    only separates them.
    """
    block, invoke, parameter = flavor.block, flavor.invoke, flavor.parameter
    dsml = tokens.get("dsml")
    think = tokens.get("thinking_start")
    end_think = tokens.get("thinking_end")
    lines = [tool_schema_line(t, flavor) for t in tools if not t.defer_loading]
    if flavor.schema_lines_end_with_newline:
        listed = "".join(f"{line}\n" for line in lines) + "\n"
    else:
        listed = "\n".join(lines) + "\n\n"
    d = special(dsml)
    return [
        text(
            "## Tools\n\nYou have access to a set of tools to help answer the user's question. "
            'You can invoke tools by writing a "<'
        ),
        d,
        text(f'{block}>" block like the following:\n\n<'),
        d,
        text(f"{block}>\n<"),
        d,
        text(f'{invoke} name="$TOOL_NAME">\n<'),
        d,
        text(f'{parameter} name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE</'),
        d,
        text(f"{parameter}>\n...\n</"),
        d,
        text(f"{invoke}>\n<"),
        d,
        text(f'{invoke} name="$TOOL_NAME2">\n...\n</'),
        d,
        text(f"{invoke}>\n</"),
        d,
        text(
            f'{block}>\n\nString parameters should be specified as is and set `string="true"`. '
            "For all other "
            "types (numbers, booleans, arrays, objects), pass the value in JSON format and set "
            '`string="false"`.'
            "\n\nIf thinking_mode is enabled (triggered by "
        ),
        special(think),
        text("), you MUST output your complete reasoning inside "),
        special(think),
        text("..."),
        special(end_think),
        text(" BEFORE any tool calls or final response.\n\nOtherwise, output directly after "),
        special(end_think),
        text(
            " with tool calls or final response.\n\n### Available Tool Schemas\n\n"
            f"{listed}You MUST strictly follow the above defined tool name and parameter "
            "schemas to invoke "
            "tool calls.\n"
        ),
    ]
