"""``deepinfer chat``: an interactive conversation, streamed, with reasoning shown apart."""

from __future__ import annotations

import argparse
import sys

from deepinfer.chat import DEFAULT_CHAT_MODEL, ChatFormatter, ChatPrompt
from deepinfer.errors import DeepInferError
from deepinfer.llm import LLM
from deepinfer.sampling_params import SamplingParams


def _styles(stream: object) -> tuple[str, str]:
    """Dim text for reasoning on a terminal; plain markers otherwise."""
    if getattr(stream, "isatty", lambda: False)():
        return "\033[2m", "\033[0m"
    return "", ""


def run_chat(args: argparse.Namespace) -> int:
    try:
        llm = LLM(args.model, device=args.device, dtype=args.dtype, seed=args.seed)
    except DeepInferError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    chat = ChatFormatter(llm.tokenizer_path)
    params = SamplingParams(
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        max_tokens=args.max_tokens,
        seed=args.sample_seed,
    )
    dim, reset = _styles(sys.stdout)
    history: list[dict[str, str]] = []
    if args.system:
        history.append({"role": "system", "content": args.system})
    print(
        "Chatting with the model; /reset starts over, an empty line, /exit or Ctrl-D ends.",
        file=sys.stderr,
    )
    while True:
        try:
            line = input("you> ")
        except EOFError:
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
        except DeepInferError as exc:
            print(f"error: {exc}", file=sys.stderr)
            history.pop()
            continue
        answer = _stream_reply(llm, chat, prompt, params, (dim, reset))
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
        ids = out.outputs[0].token_ids
        new = [t for t in ids[shown:] if t not in eos]
        shown = len(ids)
        emit(stream.chunks(new))
        finish = out.outputs[0].finish_reason or finish
    emit(stream.finish_chunks(finish))
    sys.stdout.write(f"{reset}\n")
    return answer
