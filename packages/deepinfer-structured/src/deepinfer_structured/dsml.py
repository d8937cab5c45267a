"""The DSML tool-call grammar: what a reply must be once the prompt opened a tool-call block.

With ``tool_choice`` required or named, the chat template ends the prompt inside the block
(``<｜DSML｜ calls>\\n`` on V4.1, ``<｜DSML｜tool_calls>\\n`` on V4), so the reply is one or more
invokes and the block's end, spelled exactly as the template renders an assistant's tool calls::

    <D invoke name="get_weather">
    <D parameter name="city" string="true">Paris</D parameter>
    <D parameter name="days" string="false">2</D parameter>
    </D invoke>
    </D calls>

(``D`` is the ``｜DSML｜`` control token; V4 writes ``invoke``/``parameter``/``tool_calls`` with
no space after it, and no blank line in an invoke without parameters.) The chat parser finds
these tags by the control token only: the same text spelled from ordinary tokens is plain text.
The grammar therefore places the token by id, and the backend compiles it against a vocabulary
in which that token's text is a byte no UTF-8 character contains, so no string value can hold
it while any other text stays allowed.

Each argument is constrained by its property's schema: a plain string (optionally with length
bounds or string enum/const) is written raw with ``string="true"`` as the template does; every
other value is compact JSON with ``string="false"``, from xgrammar's JSON-schema grammar.
Parameters follow the schema's ``properties`` order, required ones always present; properties
the schema does not list are never generated (valid whatever ``additionalProperties`` says).
Top-level keywords that would make that choice unsound are refused at submit time.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from deepinfer.errors import InvalidRequestError
from deepinfer.structured import DsmlTool

#: Builds the EBNF of one JSON value under a schema; the second argument names it in errors.
JsonGrammar = Callable[[Any, str], str]

#: Keys a tool's top-level parameters schema may hold. Anything else (``minProperties``,
#: ``patternProperties``, ``propertyNames``, ``dependentRequired``, combinators, ``$ref``, ...)
#: could make "declared properties, in order, required ones present" invalid or incomplete.
_OBJECT_KEYS = frozenset(
    {
        "type", "properties", "required", "additionalProperties", "unevaluatedProperties",
        "description", "title", "$schema", "$id", "$comment", "$defs", "definitions",
        "default", "examples", "strict",
    }
)  # fmt: skip
#: Keys of a property schema that still leave it a plain string written raw (``string="true"``).
_RAW_STRING_KEYS = frozenset(
    {"type", "minLength", "maxLength", "description", "title", "default", "examples", "$comment"}
)
_DIALECTS = {
    # block, invoke, parameter spellings after the control token; blank line in an empty invoke
    "v4.1": (" calls", " invoke", " parameter", True),
    "v4": ("tool_calls", "invoke", "parameter", False),
}


def _ebnf_string(text: str) -> str:
    """An EBNF string literal for ``text`` (JSON escapes, which xgrammar's EBNF reads)."""
    return json.dumps(text, ensure_ascii=False)


def _raw_string_grammar(schema: dict[str, Any]) -> str | None:
    """EBNF for a string argument written raw, or None when it must be JSON."""
    if schema.get("type") == "string" and set(schema) <= _RAW_STRING_KEYS:
        low = int(schema.get("minLength", 0))
        high = schema.get("maxLength")
        bound = f"{{{low},{int(high)}}}" if high is not None else f"{{{low},}}" if low else "*"
        return f"root ::= [\\0-\\U0010ffff]{bound}"
    values: list[Any] | None = None
    if "enum" in schema:
        values = list(schema["enum"])
    elif "const" in schema:
        values = [schema["const"]]
    rest = set(schema) - {"enum", "const"}
    strings = values and all(isinstance(v, str) for v in values)
    if strings and rest <= _RAW_STRING_KEYS and schema.get("type", "string") == "string":
        return "root ::= " + " | ".join(_ebnf_string(v) for v in values)
    return None


def _tool_parameters(tool: DsmlTool) -> dict[str, Any]:
    if not tool.parameters:
        return {"type": "object", "properties": {}}
    schema = json.loads(tool.parameters)
    if not isinstance(schema, dict):
        raise InvalidRequestError(
            "tools", f"tool {tool.name!r}: parameters must be a JSON-schema object"
        )
    return schema


def tool_call_tag(
    tools: tuple[DsmlTool, ...], dialect: str, dsml_token_id: int, json_grammar: JsonGrammar
) -> Any:
    """The structural tag of a tool-call block's remainder (xgrammar ``StructuralTag``).

    ``json_grammar(schema, where)`` returns the EBNF of one JSON value under ``schema`` and
    raises InvalidRequestError (naming ``where``) when the backend cannot enforce it.
    """
    from xgrammar.structural_tag import (
        ConstStringFormat,
        GrammarFormat,
        OptionalFormat,
        OrFormat,
        SequenceFormat,
        StarFormat,
        StructuralTag,
        TokenFormat,
    )

    block, invoke, parameter, blank_when_empty = _DIALECTS[dialect]
    token = TokenFormat(token=dsml_token_id)

    def text(value: str) -> Any:
        return ConstStringFormat(value=value)

    def seq(*items: Any) -> Any:
        return SequenceFormat(elements=list(items))

    def param(tool: str, key: str, schema: Any, defs: dict[str, Any]) -> Any:
        where = f"tools[{tool}].parameters.properties.{key}"
        raw = _raw_string_grammar(schema) if isinstance(schema, dict) else None
        if raw is not None:
            flag, value = "true", GrammarFormat(grammar=raw)
        else:
            full = schema
            if isinstance(schema, dict) and defs:  # keep the root's $defs reachable
                full = dict(schema)
                for name, table in defs.items():
                    full[name] = {**table, **(schema.get(name) or {})}
            flag, value = "false", GrammarFormat(grammar=json_grammar(full, where))
        head = f'{parameter} name={_ebnf_attr(key)} string="{flag}">'
        return seq(text("<"), token, text(head), value, text("</"), token, text(f"{parameter}>\n"))

    invokes = []
    for tool in tools:
        schema = _tool_parameters(tool)
        where = f"tools[{tool.name}].parameters"
        extra = sorted(set(schema) - _OBJECT_KEYS)
        if extra:
            raise InvalidRequestError(
                where, f"keyword '{extra[0]}' is not supported in a constrained tool call"
            )
        if schema.get("type", "object") != "object":
            raise InvalidRequestError(where, "must describe an object")
        properties = schema.get("properties") or {}
        required = list(schema.get("required") or [])
        missing = [k for k in required if k not in properties]
        if missing:
            raise InvalidRequestError(
                where, f"required property '{missing[0]}' is not among its properties"
            )
        defs = {k: schema[k] for k in ("$defs", "definitions") if k in schema}
        params = [(k in required, param(tool.name, k, s, defs)) for k, s in properties.items()]
        head = seq(text("<"), token, text(f"{invoke} name={_ebnf_attr(tool.name)}>\n"))
        tail = seq(text("</"), token, text(f"{invoke}>"))
        if any(req for req, _ in params):
            body = seq(*(p if req else OptionalFormat(content=p) for req, p in params))
        else:
            # All optional: the template writes a blank line (V4.1) when none is given.
            nonempty = [
                seq(params[i][1], *(OptionalFormat(content=p) for _, p in params[i + 1 :]))
                for i in range(len(params))
            ]
            empty = text("\n" if blank_when_empty else "")
            body = OrFormat(elements=[*nonempty, empty]) if nonempty else empty
        invokes.append(seq(head, body, tail))
    one = invokes[0] if len(invokes) == 1 else OrFormat(elements=invokes)
    more = StarFormat(content=seq(text("\n"), one))
    end = seq(text("\n</"), token, text(f"{block}>"))
    return StructuralTag(format=seq(one, more, end))


def _ebnf_attr(value: str) -> str:
    """A tag attribute value as the template writes it: in double quotes, unescaped."""
    if '"' in value:
        raise InvalidRequestError("tools", f"name {value!r} cannot be written in a DSML tag")
    return f'"{value}"'
