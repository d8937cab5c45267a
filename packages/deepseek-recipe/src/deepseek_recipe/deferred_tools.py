"""Deferred tool loading on V4.1: tools announced by a system message mid-conversation.

A deferred tool is offered (the constraint lists it) but left out of the opening
tools block; when the history loads it (a Responses tool search output, a
Messages `tool_reference` or `tool_addition`), a system message at that point
carries its schema and the V4.1 prompt shows it as "Updated Tool Schemas".

History builders only know the names of the tools a message loads: schemas are
checked and normalized later, and the tool choice may narrow what is offered.
So they record placeholders, and `resolve_loaded_tools` swaps in the final
definitions once the offered tools are known, keeping only tools still offered.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from deepseek_recipe.messages import (
    ImageSource,
    Message,
    Segment,
    SystemMessage,
    ToolDefinition,
)

ALL_DEFERRED = (
    "tools: at least one tool must have defer_loading=false. All tools cannot be deferred."
)


def loading_message(
    names: Iterable[str],
    segments: Sequence[Segment] = (),
    sources: Sequence[ImageSource] | None = None,
) -> SystemMessage:
    """A system message (with this content) that loads the named tools."""
    return SystemMessage(list(segments), sources, [ToolDefinition(n) for n in names])


def resolve_loaded_tools(
    messages: list[Message], offered: Sequence[ToolDefinition]
) -> list[Message]:
    """The messages with each loading message's tools replaced by the offered definitions.

    A loaded tool that is not offered (tool choice `none`, or a named choice of another
    tool) is left out; a loading message left without tools is dropped when it has no
    content, and otherwise kept with an empty tool list.
    """
    by_name = {t.name: t for t in offered}
    out: list[Message] = []
    for m in messages:
        if not isinstance(m, SystemMessage) or m.tools is None:
            out.append(m)
            continue
        tools = [by_name[t.name] for t in m.tools if t.name in by_name]
        if tools or m.segments:
            out.append(SystemMessage(m.segments, m.image_sources, tools))
    return out
