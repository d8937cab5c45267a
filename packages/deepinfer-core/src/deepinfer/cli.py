"""The ``deepinfer`` command line: info, generate, chat, bench.

Every failure a user can cause (a bad option, a broken checkpoint, a rejected request) ends the
same way: one ``error: ...`` line on stderr and exit status 2, whichever subcommand raised it.
Ctrl-C ends with status 130 (the shell's 128 + SIGINT) and no traceback. Both are handled once,
in :func:`main`; a traceback therefore always means a bug.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import platform
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from importlib import metadata
from typing import TYPE_CHECKING, Any, NoReturn

from deepinfer import info
from deepinfer.__about__ import __version__
from deepinfer.dp.options import add_parallel_args, parallel_options
from deepinfer.errors import DeepInferError, InvalidRequestError

if TYPE_CHECKING:
    from deepinfer.sampling_params import SamplingParams

#: Exit status of a CLI error (argparse's own usage errors use it too).
EXIT_USAGE = 2
#: Exit status after Ctrl-C, as a shell reports a process ended by SIGINT.
EXIT_INTERRUPTED = 130

#: SamplingParams field -> the flag that sets it, so a rejected value names the flag.
_SAMPLING_FLAGS = {
    "max_tokens": "--max-tokens",
    "temperature": "--temperature",
    "top_p": "--top-p",
    "top_k": "--top-k",
    "seed": "--sample-seed",
}


class UsageError(DeepInferError):
    """A command-line option is invalid or inconsistent with another one."""

    def __init__(self, flag: str, reason: str) -> None:
        super().__init__(f"argument {flag}: {reason}")
        self.flag = flag


class _Parser(argparse.ArgumentParser):
    """argparse whose errors look like every other CLI error: one line, exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"error: {message} (see '{self.prog} --help')\n")


def version_line() -> str:
    """``deepinfer X`` (X: deepinfer-core's version, ``deepinfer.__version__``), then the other
    installed family distributions, torch and Python: what a bug report needs, on one line.
    Read from metadata, so nothing heavy is imported."""
    parts = []
    for dist in (*info.DISTRIBUTIONS, "torch"):
        if dist in ("deepinfer", "deepinfer-core"):
            continue
        try:
            parts.append(f"{dist} {metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            continue
    parts.append(f"python {platform.python_version()}")
    return f"deepinfer {__version__} ({', '.join(parts)})"


class _VersionAction(argparse.Action):
    """``--version``: argparse's own action re-wraps the line to the terminal width."""

    def __init__(self, option_strings: list[str], dest: str, help: str) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(self, parser: argparse.ArgumentParser, *args: object) -> NoReturn:
        print(version_line())
        parser.exit(0)


def _int_at_least(low: int) -> Callable[[str], int]:
    """An argparse ``type`` that rejects integers below ``low`` before anything is loaded."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
        return value

    parse.__name__ = f"integer >= {low}"
    return parse


def sampling_params(args: argparse.Namespace) -> SamplingParams:
    """The request's SamplingParams from the sampling flags; a rejected value names its flag.

    Built before the model loads, so a bad value fails at once rather than after loading.
    """
    from deepinfer.sampling_params import SamplingParams

    try:
        return SamplingParams(
            temperature=args.temperature,
            top_p=args.top_p,
            top_k=args.top_k,
            max_tokens=args.max_tokens,
            seed=args.sample_seed,
        )
    except InvalidRequestError as exc:
        flag = _SAMPLING_FLAGS.get(exc.field)
        if flag is None:
            raise
        raise UsageError(flag, exc.reason) from exc


def _cmd_info(args: argparse.Namespace) -> int:
    if args.model is not None:  # the model report replaces the environment report
        from deepinfer import model_info

        model = model_info.model_report(
            args.model, args.max_model_len, args.num_seqs, args.gpu_memory, args.gpu_memory_util
        )
        text = json.dumps(model.to_dict(), indent=2)
        print(text if args.json else model_info.format_model_report(model))
        return 0
    report = info.collect()
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(info.format_report(report))
    return 1 if report.errors else 0


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="tiny", help="'tiny' (embedded) or a checkpoint directory")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda[:i] or npu[:i]")
    p.add_argument(
        "--dtype",
        default="auto",
        choices=("auto", "float32", "bfloat16", "float16"),
        help="weights and activations; auto: float32 on a CPU, bfloat16 elsewhere",
    )
    p.add_argument("--seed", type=int, default=0, help="engine seed for unseeded requests")
    p.add_argument(
        "--load-format",
        default="auto",
        choices=("auto", "safetensors", "dummy"),
        help="dummy: seeded random weights from config.json alone (benchmarks; outputs mean "
        "nothing)",
    )
    p.add_argument(
        "--quantization",
        default="auto",
        choices=("auto", "none"),
        help="auto: compute on FP8 weights as stored where the backend has kernels; none: "
        "dequantise every weight at load",
    )
    add_parallel_args(p)


def model_options(args: argparse.Namespace) -> dict[str, Any]:
    """``LLM`` keyword arguments from the options :func:`_add_model_args` adds."""
    return {
        "device": args.device,
        "dtype": args.dtype,
        "seed": args.seed,
        "load_format": args.load_format,
        "quantization": None if args.quantization == "none" else "auto",
        **parallel_options(args),
    }


def _add_sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-tokens", type=int, default=128, help="most tokens to generate")
    p.add_argument(
        "--temperature", type=float, default=0.8, help="sampling temperature; 0 is greedy"
    )
    p.add_argument(
        "--top-p", type=float, default=0.95, help="nucleus sampling: keep this probability mass"
    )
    p.add_argument(
        "--top-k", type=int, default=0, help="keep only the k likeliest tokens; 0 keeps all"
    )
    p.add_argument("--sample-seed", type=int, default=None, help="seed of the request itself")


def _cmd_generate(args: argparse.Namespace) -> int:
    params = sampling_params(args)
    with deferred_interrupts():
        from deepinfer.llm import LLM

    llm = LLM(args.model, **model_options(args))
    echoed, shown = False, 0
    out = None
    for out in llm.stream(args.prompt, params):
        check_interrupted()
        if not echoed:  # once the request is accepted, so a rejection is not appended to it
            sys.stdout.write(args.prompt)
            echoed = True
        text = out.outputs[0].text
        sys.stdout.write(text[shown:])
        sys.stdout.flush()
        shown = len(text)
    sys.stdout.write("\n")
    if out is not None:
        c = out.outputs[0]
        print(f"[{len(c.token_ids)} tokens, finish_reason={c.finish_reason}]", file=sys.stderr)
    return 0


def _cmd_chat(args: argparse.Namespace) -> int:
    params = sampling_params(args)  # bad options fail before torch is even imported
    with deferred_interrupts():
        from deepinfer.chat_cli import run_chat

    return run_chat(args, params)


def _add_speculative_args(p: argparse.ArgumentParser) -> None:
    """``bench``'s speculative decoding options (its ``speculative_config``)."""
    p.add_argument(
        "--speculative-method", choices=("mtp", "dspark"), help="speculative decoding's drafter"
    )
    p.add_argument(
        "--num-speculative-tokens", type=_int_at_least(1), default=3, help="drafts a round"
    )
    p.add_argument(
        "--speculative-scheduling",
        choices=("fixed", "adaptive"),
        default="fixed",
        help="drafts verified a round: all, or planned from their confidences and the step's "
        "profiled cost",
    )
    p.add_argument("--confidence-threshold", type=float, default=0.0,
                   help="verify up to the first draft below this confidence")  # fmt: skip


def _cmd_bench(args: argparse.Namespace) -> int:
    from deepinfer.bench import run_bench  # light: it checks the options before torch loads

    return run_bench(args)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="deepinfer", description="DeepInfer: inference for DeepSeek-V4-family models"
    )
    parser.add_argument(
        "--version",
        action=_VersionAction,
        help="print the versions of DeepInfer, its installed packages, torch and Python",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p_info = sub.add_parser(
        "info", help="installed DeepInfer packages, plugins, and the device/backend in use"
    )
    p_info.add_argument("--json", action="store_true", help="machine-readable output")
    p_info.add_argument("--model", default=None, help="report on this model directory instead")
    p_info.add_argument("--max-model-len", type=_int_at_least(1), default=65536, help="tokens")
    p_info.add_argument("--num-seqs", type=_int_at_least(1), default=64, help="per GPU")
    p_info.add_argument("--gpu-memory", type=float, default=139.0, help="GiB per GPU (H200: 139)")
    p_info.add_argument(
        "--gpu-memory-utilization", dest="gpu_memory_util", type=float, default=0.9, help="0-1"
    )
    p_info.set_defaults(func=_cmd_info)

    p_gen = sub.add_parser("generate", help="continue a prompt, streaming the text")
    p_gen.add_argument("prompt", help="the text to continue (no chat template is applied)")
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
    positive = _int_at_least(1)  # a count or length of zero makes no benchmark
    for flag, default, what in (
        ("--num-seqs", 16, "sequences to generate"),
        ("--min-input-len", 16, "shortest prompt, in tokens"),
        ("--max-input-len", 256, "longest prompt, in tokens"),
        ("--min-output-len", 16, "fewest tokens a sequence generates"),
        ("--max-output-len", 64, "most tokens a sequence generates"),
        ("--max-num-seqs", 256, "most sequences decoded together"),
        ("--max-num-batched-tokens", 8192, "token budget of one step"),
    ):
        p_bench.add_argument(flag, type=positive, default=default, help=what)
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
    _add_speculative_args(p_bench)
    p_bench.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    p_bench.set_defaults(func=_cmd_bench)
    return parser


class Interrupted(KeyboardInterrupt):
    """Ctrl-C while a command runs.

    A subclass because CPython remembers a bare KeyboardInterrupt that passes through an
    embedded ``PyRun_String`` (extension modules evaluate snippets that way) and, under
    ``python -m deepinfer``, ends the process by SIGINT at exit, even after :func:`main` has
    handled it and asked for status 130; it checks for that exact type only.
    """


class _Interrupt:
    """Whether Ctrl-C was pressed during this command.

    Extension code that the interrupt lands in does not always let it through: it may clear it
    and carry on (then the command's loops find the flag, see :func:`check_interrupted`) or
    turn it into another exception (then :func:`main` still reports an interruption).
    """

    requested = False
    #: Inside :func:`deferred_interrupts`: note Ctrl-C, act on it afterwards.
    deferred = False


def _on_sigint(signum: int, frame: object) -> None:
    _Interrupt.requested = True
    if not _Interrupt.deferred:
        raise Interrupted


def check_interrupted() -> None:
    """Raise :class:`Interrupted` if Ctrl-C was pressed and swallowed on its way up."""
    if _Interrupt.requested:
        raise Interrupted


@contextlib.contextmanager
def deferred_interrupts() -> Iterator[None]:
    """Hold Ctrl-C back until the block ends, then act on it.

    For importing torch and the modules built on it: an interrupt that lands in torch's native
    initialisation aborts the whole process (SIGABRT and a core dump) instead of raising.
    """
    _Interrupt.deferred = True
    try:
        yield
    finally:
        _Interrupt.deferred = False
    check_interrupted()


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(format="%(levelname)s: %(message)s", level=logging.WARNING)
    args = build_parser().parse_args(argv)
    _Interrupt.requested = False
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, _on_sigint) if in_main_thread else None
    try:
        return int(args.func(args))
    except BaseException as exc:
        if _Interrupt.requested or isinstance(exc, KeyboardInterrupt):
            # Ctrl-C is the way to stop a long generation, not a crash: no traceback, and a
            # newline so that the shell prompt does not follow half a line of streamed text.
            sys.stderr.write("\n")
            return EXIT_INTERRUPTED
        if isinstance(exc, DeepInferError):
            message = " ".join(str(exc).splitlines())
            print(f"error: {message}", file=sys.stderr)
            return EXIT_USAGE
        raise
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


if __name__ == "__main__":
    sys.exit(main())
