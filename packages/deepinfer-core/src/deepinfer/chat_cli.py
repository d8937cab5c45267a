"""``deepinfer chat``: an interactive conversation, streamed, with reasoning shown apart.

Errors that end the session (bad options, a model that does not load) propagate to
:func:`deepinfer.cli.main`, which reports them on one line; an error in one turn (a prompt the
engine rejects) is reported and the conversation goes on without that turn.
"""

from __future__ import annotations

import argparse
import sys

from deepinfer.chat import DEFAULT_CHAT_MODEL, ChatFormatter, ChatPrompt
from deepinfer.cli import check_interrupted, model_options
from deepinfer.errors import DeepInferError
from deepinfer.llm import LLM
from deepinfer.sampling_params import SamplingParams


def _styles(stream: object) -> tuple[str, str]:
    """Dim text for reasoning on a terminal; plain markers otherwise."""
    if getattr(stream, "isatty", lambda: False)():
        return "\033[2m", "\033[0m"
    return "", ""


def _read_line(prompt: str) -> str | None:
    """The next line typed, or None at the end of input (Ctrl-D, a closed or exhausted stdin)."""
    if sys.stdin is None or sys.stdin.closed:
        return None
    try:
        return input(prompt)
    except EOFError:
        return None


def run_chat(args: argparse.Namespace, params: SamplingParams) -> int:
    """The conversation; ``params`` are built from ``args`` by :func:`deepinfer.cli.sampling_params`
    before this module (and torch with it) is imported, so bad options fail at once."""
    if sys.stdin is None or sys.stdin.closed:
        return 0  # nothing can ever be asked: do not load the model for nothing
    llm = LLM(args.model, **model_options(args))
    chat = ChatFormatter(llm.tokenizer_path)
    dim, reset = _styles(sys.stdout)
    history: list[dict[str, str]] = []
    if args.system:
        history.append({"role": "system", "content": args.system})
    print(
        "Chatting with the model; /reset starts over, an empty line, /exit or Ctrl-D ends.",
        file=sys.stderr,
    )
    while True:
        check_interrupted()
        line = _read_line("you> ")
        if line is None:
            sys.stdout.write("\n")
            break
        command = line.strip()
        if command in {"", "/exit", "/quit"}:
            break
        if command == "/reset":
            del history[1 if args.system else 0 :]
            print("(conversation reset)", file=sys.stderr)
            continue
        history.append({"role": "user", "content": line})
        body = {
            "model": DEFAULT_CHAT_MODEL,
            "messages": history,
            "thinking": {"type": "enabled" if args.thinking else "disabled"},
        }
        try:
            prompt = chat.prompt(body)
            answer = _stream_reply(llm, chat, prompt, params, (dim, reset))
        except DeepInferError as exc:  # this turn only (say, a conversation grown too long)
            print(f"error: {exc}", file=sys.stderr)
            history.pop()
            continue
        history.append({"role": "assistant", "content": answer})
    return 0


def _stream_reply(
    llm: LLM,
    chat: ChatFormatter,
    prompt: ChatPrompt,
    params: SamplingParams,
    style: tuple[str, str],
) -> str:
    dim, reset = style
    stream = chat.stream(prompt)
    eos = llm.engine.eos_token_ids
    shown, field_now, answer = 0, None, ""
    finish = "stop"

    def emit(chunks: list) -> None:  # type: ignore[type-arg]
        nonlocal field_now, answer
        for field, text in stream.deltas(chunks):
            if field != field_now:
                label = f"{dim}(thinking) " if field == "reasoning_content" else f"{reset}\nmodel> "
                sys.stdout.write(label if field_now or field == "reasoning_content" else "model> ")
                field_now = field
            sys.stdout.write(text)
            if field == "content":
                answer += text
        sys.stdout.flush()

    for out in llm.stream(prompt.token_ids, params):
        check_interrupted()
        ids = out.outputs[0].token_ids
        new = [t for t in ids[shown:] if t not in eos]
        shown = len(ids)
        emit(stream.chunks(new))
        finish = out.outputs[0].finish_reason or finish
    emit(stream.finish_chunks(finish))
    sys.stdout.write(f"{reset}\n")
    return answer
