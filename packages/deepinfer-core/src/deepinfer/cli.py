"""The ``deepinfer`` command line: info, generate, bench."""

from __future__ import annotations

import argparse
import json
import logging
import sys

from deepinfer import info


def _cmd_info(args: argparse.Namespace) -> int:
    report = info.collect()
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(info.format_report(report))
    return 1 if report.errors else 0


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="tiny", help="'tiny' (embedded) or a checkpoint directory")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda[:i] or npu[:i]")
    p.add_argument("--dtype", default="auto", help="auto, float32, bfloat16 or float16")
    p.add_argument("--seed", type=int, default=0, help="engine seed for unseeded requests")


def _add_sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--sample-seed", type=int, default=None, help="seed of the request itself")


def _cmd_generate(args: argparse.Namespace) -> int:
    from deepinfer.errors import DeepInferError
    from deepinfer.llm import LLM
    from deepinfer.sampling_params import SamplingParams

    try:
        llm = LLM(args.model, device=args.device, dtype=args.dtype, seed=args.seed)
        params = SamplingParams(
            temperature=args.temperature,
            top_p=args.top_p,
            top_k=args.top_k,
            max_tokens=args.max_tokens,
            seed=args.sample_seed,
        )
        sys.stdout.write(args.prompt)
        shown = 0
        out = None
        for out in llm.stream(args.prompt, params):
            text = out.outputs[0].text
            sys.stdout.write(text[shown:])
            sys.stdout.flush()
            shown = len(text)
        sys.stdout.write("\n")
        if out is not None:
            c = out.outputs[0]
            print(f"[{len(c.token_ids)} tokens, finish_reason={c.finish_reason}]", file=sys.stderr)
    except DeepInferError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


def _cmd_chat(args: argparse.Namespace) -> int:
    from deepinfer.chat_cli import run_chat

    return run_chat(args)


def _cmd_bench(args: argparse.Namespace) -> int:
    from deepinfer.bench import run_bench

    return run_bench(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="deepinfer", description="DeepInfer: inference for DeepSeek-V4-family models"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p_info = sub.add_parser(
        "info", help="installed DeepInfer packages, plugins, and the device/backend in use"
    )
    p_info.add_argument("--json", action="store_true", help="machine-readable output")
    p_info.set_defaults(func=_cmd_info)

    p_gen = sub.add_parser("generate", help="continue a prompt, streaming the text")
    p_gen.add_argument("prompt")
    _add_model_args(p_gen)
    _add_sampling_args(p_gen)
    p_gen.set_defaults(func=_cmd_generate)

    p_chat = sub.add_parser("chat", help="interactive chat, streaming, reasoning shown apart")
    _add_model_args(p_chat)
    _add_sampling_args(p_chat)
    p_chat.add_argument("--system", default=None, help="system prompt")
    p_chat.add_argument("--thinking", action="store_true", help="ask the model to reason first")
    p_chat.set_defaults(func=_cmd_chat)

    p_bench = sub.add_parser(
        "bench", help="offline throughput: N sequences of random input/output lengths"
    )
    _add_model_args(p_bench)
    p_bench.add_argument("--num-seqs", type=int, default=16)
    p_bench.add_argument("--min-input-len", type=int, default=16)
    p_bench.add_argument("--max-input-len", type=int, default=256)
    p_bench.add_argument("--min-output-len", type=int, default=16)
    p_bench.add_argument("--max-output-len", type=int, default=64)
    p_bench.add_argument("--max-num-seqs", type=int, default=256)
    p_bench.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p_bench.add_argument(
        "--enforce-eager", action="store_true", help="no CUDA graphs for decode steps (GPU)"
    )
    p_bench.add_argument(
        "--no-async-scheduling",
        dest="async_scheduling",
        action="store_false",
        default=None,
        help="read each step's tokens before queueing the next (GPU; vLLM's flag)",
    )
    p_bench.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    p_bench.set_defaults(func=_cmd_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(format="%(levelname)s: %(message)s", level=logging.WARNING)
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
