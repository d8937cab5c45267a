"""Responses tool declarations → function tools the prompt can describe.

The model only knows flat function tools, so the other Responses tool kinds are
mapped onto them: a namespace's functions get qualified names (`ns__fn` for
V4, `ns::fn` for V4.1) that the response side splits again, the `apply_patch`
custom tool becomes a function taking one `input` string, a client-executed
tool search becomes a `tool_search` function on V4.1 (the caller runs the
search), and web search (a server tool the recipe cannot run) is dropped or
rejected.  Tools that a tool search loads later in the history are mapped the
same way (see `responses_tool_search`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from deepseek_recipe import serde_decode as s
from deepseek_recipe.apply_patch import (
    APPLY_PATCH,
    APPLY_PATCH_DESCRIPTION,
    APPLY_PATCH_DESCRIPTION_V41,
    apply_patch_parameters,
)
from deepseek_recipe.errors import ConversionError
from deepseek_recipe.options import ConversionOptions, ModelVersion, WebSearchBehavior
from deepseek_recipe.schema import check_tool_name

_WEB_SEARCH = ("web_search", "web_search_2025_08_26")


def qualified_name(namespace: str, name: str, version: ModelVersion) -> str:
    """How a namespace and a function name are joined in the prompt.

    V4.1 uses `ns::fn`.  V4 uses `ns__fn`, without the separator when an underscore is
    already there (`ns_` + `fn` → `ns_fn`), so the name stays a valid identifier.
    """
    if version is ModelVersion.DeepseekV41Flash:
        return f"{namespace}::{name}"
    if namespace.endswith("_") or name.startswith("_"):
        return f"{namespace}{name}"
    return f"{namespace}__{name}"


TOOL_SEARCH = "tool_search"


@dataclass
class DeclaredTool:
    """One function tool offered to the model, before schema checks and normalization.

    `deferred` marks a tool loaded by a tool search: the prompt announces it where
    it was loaded instead of in the opening tools block.
    """

    name: str
    description: str | None
    parameters: Any
    strict: bool | None
    deferred: bool = False


@dataclass
class DeclaredTools:
    """The declared tools and what the response side needs to undo the mapping.

    `client_tool_search` records a client-executed tool search declaration: the
    response side then reports calls of `tool_search` as tool search calls.
    """

    tools: list[DeclaredTool] = field(default_factory=list)
    namespace_map: dict[str, tuple[str, str]] = field(default_factory=dict)
    custom_names: set[str] = field(default_factory=set)
    client_tool_search: bool = False

    def extend(self, other: DeclaredTools) -> None:
        """Add `other`'s tools after these, with what undoes their mapping."""
        self.tools += other.tools
        self.namespace_map.update(other.namespace_map)
        self.custom_names |= other.custom_names


def check_tool_name_at(path: str, name: str) -> None:
    """The name checks of the Chat Completions converter, reported at a Responses path."""
    try:
        check_tool_name(0, name)
    except ConversionError as exc:
        message = str(exc).replace("tools[0].function.name", path)
        raise ConversionError(message) from None


def check_declaration(path: str, tool: Any, *, custom: bool, reject_web_search: bool) -> None:
    """The checks of one declaration at request location `path` (`tools[0]`): names, what a
    namespace may hold, custom tools (with `custom`) and web search (when configured to
    reject it)."""
    if tool is s.UNSUPPORTED:
        return
    kind = tool["type"]
    if kind == "custom" and custom and tool["name"] != APPLY_PATCH:
        raise ConversionError(
            f"Unsupported custom tool: '{tool['name']}'. Only 'apply_patch' is supported."
        )
    if kind in _WEB_SEARCH and reject_web_search:
        raise ConversionError("Server tools are not supported")
    if kind not in ("function", "namespace"):
        return
    check_tool_name_at(f"{path}.name", tool["name"])
    if kind != "namespace":
        return
    seen: set[str] = set()
    for j, inner in enumerate(tool["tools"]):
        if inner["type"] == "custom":
            raise ConversionError(
                "Currently custom tools are not allowed inside a namespace. Found custom "
                f"tool '{inner['name']}' in {path}.tools[{j}]."
            )
        check_tool_name_at(f"{path}.tools[{j}].name", inner["name"])
        if inner["name"] in seen:
            raise ConversionError("Tool names within a namespace must be unique.")
        seen.add(inner["name"])


def _namespace_names(
    tools: list[Any], version: ModelVersion, taken: set[str] | None = None
) -> dict[tuple[int, int], str]:
    """The prompt name of every namespace function, keyed by (tool index, inner index).

    Names are made unique against the plain function names, the `taken` names (tools
    offered before these) and each other with a `_1`, `_2` ... suffix, so two
    namespaces may share function names.
    """
    used = set(taken or ())
    used |= {t["name"] for t in tools if t is not s.UNSUPPORTED and t["type"] == "function"}
    names: dict[tuple[int, int], str] = {}
    for i, tool in enumerate(tools):
        if tool is s.UNSUPPORTED or tool["type"] != "namespace":
            continue
        for j, inner in enumerate(tool["tools"]):
            base = qualified_name(tool["name"], inner["name"], version)
            name, n = base, 0
            while name in used:
                n += 1
                name = f"{base}_{n}"
            used.add(name)
            names[(i, j)] = name
    return names


def namespace_map(tools: list[Any] | None, version: ModelVersion) -> dict[str, tuple[str, str]]:
    """Prompt name → `(namespace, local name)` for every namespace function."""
    if not tools:
        return {}
    for i, tool in enumerate(tools):
        check_declaration(f"tools[{i}]", tool, custom=False, reject_web_search=False)
    return {
        name: (tools[i]["name"], tools[i]["tools"][j]["name"])
        for (i, j), name in _namespace_names(tools, version).items()
    }


def declare_tools(
    tools: list[Any] | None, version: ModelVersion, options: ConversionOptions
) -> DeclaredTools:
    """Map the declarations onto function tools, in declaration order."""
    if not tools:
        return DeclaredTools()
    reject_web_search = options.responses_web_search is WebSearchBehavior.Reject
    for i, tool in enumerate(tools):
        check_declaration(f"tools[{i}]", tool, custom=True, reject_web_search=reject_web_search)
    out = map_declarations(tools, version)
    out.client_tool_search = any(
        t is not s.UNSUPPORTED and t["type"] == TOOL_SEARCH and t["execution"] == "client"
        for t in tools
    )
    return out


def map_declarations(
    tools: list[Any],
    version: ModelVersion,
    *,
    taken: set[str] | None = None,
    deferred: bool = False,
) -> DeclaredTools:
    """Checked declarations as function tools, in order; other kinds are dropped.

    `taken` holds the names of tools already offered, which namespace functions avoid;
    `deferred` marks the tools as loaded by a tool search.
    """
    out = DeclaredTools()
    v41 = version is ModelVersion.DeepseekV41Flash
    prompt_names = _namespace_names(tools, version, taken)
    for i, tool in enumerate(tools):
        if tool is s.UNSUPPORTED:
            continue
        kind = tool["type"]
        if kind == "function":
            out.tools.append(_function(tool, tool["name"]))
        elif kind == "custom":
            description = APPLY_PATCH_DESCRIPTION_V41 if v41 else APPLY_PATCH_DESCRIPTION
            out.tools.append(DeclaredTool(APPLY_PATCH, description, apply_patch_parameters(), None))
            out.custom_names.add(APPLY_PATCH)
        elif kind == "namespace":
            for j, inner in enumerate(tool["tools"]):
                name = prompt_names[(i, j)]
                function = _function(inner, name)
                if v41 and tool["description"]:
                    # V4.1 sees the namespace's purpose in front of each of its functions.
                    function.description = f"{tool['description']}\n{inner['description'] or ''}"
                out.tools.append(function)
                out.namespace_map[name] = (tool["name"], inner["name"])
        elif kind == TOOL_SEARCH and tool["execution"] == "client" and v41:
            # The caller runs the search: the model calls it like a function.
            out.tools.append(
                DeclaredTool(TOOL_SEARCH, tool["description"], tool["parameters"], None)
            )
        # Other tool kinds (server-side tool search, tool search on V4, web search, unknown
        # kinds) are dropped: the recipe cannot run them.
    for t in out.tools:
        t.deferred = deferred
    return out


def _function(tool: dict[str, Any], name: str) -> DeclaredTool:
    return DeclaredTool(name, tool["description"], tool["parameters"], tool["strict"])


def echo_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """A declaration as the response object reports it (request fields, defaults shown)."""
    kind = tool["type"]
    if kind == "function":
        return {
            "type": "function",
            "name": tool["name"],
            "description": tool["description"],
            "parameters": tool["parameters"],
            "strict": tool["strict"],
        }
    if kind == "namespace":
        return {
            "type": "namespace",
            "name": tool["name"],
            "description": tool["description"],
            "tools": [
                echo_tool(t) if t["type"] == "function" else {"type": "custom", "name": t["name"]}
                for t in tool["tools"]
            ],
        }
    if kind == "custom":
        return {"type": "custom", "name": tool["name"]}
    if kind in _WEB_SEARCH:
        location = tool["user_location"]
        return {
            "type": kind,
            "search_context_size": tool["search_context_size"],
            "user_location": None if location is None else dict(location),
        }
    return {
        "type": "tool_search",
        "execution": tool["execution"],
        "description": tool["description"],
        "parameters": tool["parameters"],
    }


def echo_tools(tools: list[Any] | None) -> list[dict[str, Any]]:
    return [echo_tool(t) for t in tools or [] if t is not s.UNSUPPORTED]
