"""`python -m deepseek_recipe.template`: the Jinja2 chat template for DeepSeek-V4 / V4.1.

Serving stacks built on Hugging Face tokenizers (`apply_chat_template`) render
prompts with a Jinja2 `chat_template` from `tokenizer_config.json`.  This module
writes such a file whose template renders an OpenAI-style message list to the
same prompt string `DeepseekV4Encoding` / `DeepseekV41Encoding`
`render_conversation` produce for the equivalent Chat Completions request:
system placement, effort prefixes, thinking on/off, history reasoning rules,
DSML tool calls, tool results in call order, `tool_choice`, `response_format`
and prefix completion.

The package only writes the template text (kept in `chat_template.jinja`); it
never renders it, so Jinja2 is not one of its dependencies.

Template variables: `messages`, `tools`, `add_generation_prompt` (pass true; the
encoder always ends with the assistant opener), and the request fields
`thinking`, `reasoning_effort`, `tool_choice` and `response_format` as extra
keyword arguments (`apply_chat_template(..., thinking=False)`).  Tool-call
arguments must be objects: a template cannot parse JSON text.

Limitation: a template produces one string, not the special-token spans the
encoder tracks.  Content that spells a control token (a user typing
`<｜User｜>`, `<think>` or `｜DSML｜`) is plain text for the encoder, but a
tokenizer run over the rendered string with its added vocabulary turns it into
that control token.  The strings are equal; the token ids differ for such
content only.  Use the encoder's `encode` when content is untrusted.  The same
note travels inside the template and in the written JSON.

Requests the encoder would reject, and inputs the template cannot render
exactly (tool-call arguments given as JSON text that may be an object), make
the template call `raise_exception` instead of rendering a wrong prompt.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from deepseek_recipe.options import ModelVersion
from deepseek_recipe.tokens import DEFAULT_SPELLINGS

#: Model names accepted by `--model`; V4-Pro and V4-Flash share the V4 prompt format.
MODELS: dict[str, ModelVersion] = {
    "DeepSeek-V4-Flash": ModelVersion.DeepseekV4Pro,
    "DeepSeek-V4-Pro": ModelVersion.DeepseekV4Pro,
    "DeepSeek-V4.1-Flash": ModelVersion.DeepseekV41Flash,
}
DEFAULT_MODEL = "DeepSeek-V4-Flash"

_TEMPLATE_FILE = "chat_template.jinja"
# The template source selects its flavor with this one statement.
_V4_SWITCH = "{%- set v41 = false -%}"
_V41_SWITCH = "{%- set v41 = true -%}"

LIMITATION = (
    "This chat template renders the same prompt string as deepseek-recipe's "
    "render_conversation, but it cannot mark which parts are special tokens: content that "
    "spells a control token (for example a user typing '<｜User｜>', '<think>' or '｜DSML｜') "
    "is plain text for the recipe encoder yet becomes that control token when this string is "
    "tokenized with the added vocabulary. Token ids differ only for such content; use the "
    "recipe encoder when content is untrusted. Pass add_generation_prompt=true to match the "
    "encoder, tool-call arguments as objects, and the request fields thinking, "
    "reasoning_effort, tool_choice and response_format as template keyword arguments."
)


def _version(model: str | ModelVersion) -> ModelVersion:
    if isinstance(model, ModelVersion):
        return model
    try:
        return MODELS[model]
    except KeyError:
        names = ", ".join(MODELS)
        raise ValueError(f"unknown model {model!r}; expected one of {names}") from None


def chat_template(model: str | ModelVersion = DEFAULT_MODEL) -> str:
    """Return the Jinja2 chat template text for `model` (a name from `MODELS` or a version)."""
    source = resources.files("deepseek_recipe").joinpath(_TEMPLATE_FILE).read_text("utf-8")
    if source.count(_V4_SWITCH) != 1:
        raise RuntimeError(f"{_TEMPLATE_FILE} must contain {_V4_SWITCH!r} exactly once")
    if _version(model) is ModelVersion.DeepseekV41Flash:
        return source.replace(_V4_SWITCH, _V41_SWITCH)
    return source


def tokenizer_config(model: str | ModelVersion = DEFAULT_MODEL) -> dict[str, Any]:
    """A `tokenizer_config.json` mapping carrying the chat template for `model`.

    The token settings mirror the configuration shipped with the V4 tokenizer:
    no automatic BOS/EOS (the template writes BOS itself), EOS doubling as pad.
    """
    version = _version(model)
    bos, eos = DEFAULT_SPELLINGS["bos"], DEFAULT_SPELLINGS["eos"]
    return {
        "add_bos_token": False,
        "add_eos_token": False,
        "bos_token": bos,
        "eos_token": eos,
        "pad_token": eos,
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 1048576,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": chat_template(version),
        "chat_template_model": model if isinstance(model, str) else version.value,
        "chat_template_limitations": LIMITATION,
    }


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m deepseek_recipe.template",
        description=(
            "Write a tokenizer_config.json-style JSON whose chat_template renders DeepSeek-V4 / "
            "V4.1 prompts like deepseek-recipe's encoder. "
            "Limitation: the template cannot keep control-token spellings typed in content as "
            "plain text (the encoder can)."
        ),
    )
    parser.add_argument(
        "--model",
        default=DEFAULT_MODEL,
        choices=list(MODELS),
        help=f"model whose prompt format to use (default: {DEFAULT_MODEL})",
    )
    parser.add_argument(
        "--output",
        type=Path,
        default=None,
        help="file to write (default: print to standard output)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the process exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    text = json.dumps(tokenizer_config(args.model), ensure_ascii=False, indent=2) + "\n"
    if args.output is None:
        sys.stdout.write(text)
        return 0
    try:
        args.output.write_text(text, encoding="utf-8")
    except OSError as exc:
        parser.exit(1, f"{parser.prog}: error: cannot write {args.output}: {exc.strerror}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
