"""The ``deepinfer`` command line, run as a user runs it: a subprocess, judged by its exit status
and streams.

Contract: every error a user can cause is one ``error: ...`` line on stderr with exit status 2
and no traceback; options that are wrong on their face fail before the model loads; Ctrl-C ends
with status 130 and no traceback; a closed or exhausted stdin ends ``chat`` cleanly; every
option documents itself; ``--version`` reports the installed distributions.
"""

from __future__ import annotations

import argparse
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

import pytest

from deepinfer.assets import TINY_DIR
from deepinfer.cli import build_parser

CLI = [sys.executable, "-m", "deepinfer"]
ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}


def _run(*args: str, timeout: float = 120, **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=ENV,
        **kwargs,  # type: ignore[arg-type]
    )


def _assert_one_line_error(res: subprocess.CompletedProcess[str], *words: str) -> None:
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    for word in words:
        assert word in lines[0], lines[0]


# -- errors before the model loads ---------------------------------------------------------------

BAD_OPTIONS: dict[str, tuple[list[str], tuple[str, ...]]] = {
    "generate-negative-max-tokens": (["generate", "Hi", "--max-tokens", "-3"], ("--max-tokens",)),
    "generate-top-p-above-1": (["generate", "Hi", "--top-p", "1.5"], ("--top-p",)),
    "generate-not-an-int": (["generate", "Hi", "--top-k", "many"], ("--top-k", "many")),
    "generate-unknown-dtype": (["generate", "Hi", "--dtype", "fp7"], ("--dtype", "fp7")),
    "generate-no-prompt": (["generate"], ("prompt",)),
    "no-command": ([], ("COMMAND",)),
    "unknown-option": (["info", "--colour"], ("--colour",)),
    "chat-negative-max-tokens": (["chat", "--max-tokens", "-3"], ("--max-tokens",)),
    "chat-negative-temperature": (["chat", "--temperature", "-1"], ("--temperature",)),
    "bench-zero-max-num-seqs": (["bench", "--max-num-seqs", "0"], ("--max-num-seqs",)),
    "bench-zero-num-seqs": (["bench", "--num-seqs", "0"], ("--num-seqs",)),
    "bench-input-range": (
        ["bench", "--min-input-len", "10", "--max-input-len", "5"],
        ("--min-input-len", "--max-input-len"),
    ),
    "bench-output-range": (
        ["bench", "--min-output-len", "64", "--max-output-len", "8"],
        ("--min-output-len", "--max-output-len"),
    ),
}


@pytest.mark.parametrize("case", list(BAD_OPTIONS))
def test_bad_option_is_one_line_and_exit_2(case: str) -> None:
    args, words = BAD_OPTIONS[case]
    res = _run(*args, "--device", "cpu") if args and args[0] != "info" else _run(*args)
    _assert_one_line_error(res, *words)
    assert res.stdout == ""


def test_unwritable_json_path_fails_before_the_benchmark(tmp_path: Path) -> None:
    """Both used to fail only after the whole benchmark had run (its table went to stdout)."""
    a_file = tmp_path / "results.txt"
    a_file.write_text("not a folder")
    for target in (tmp_path, a_file / "bench.json"):
        res = _run("bench", "--device", "cpu", "--json", str(target))
        _assert_one_line_error(res, "--json", str(target))
        assert res.stdout == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.txt"]


# -- errors from the checkpoint ---------------------------------------------------------------


def _checkpoint_copy(root: Path) -> Path:
    root.mkdir()
    for name in ("config.json", "tokenizer.json", "model.safetensors"):
        shutil.copy(TINY_DIR / name, root / name)
    return root


def test_broken_checkpoint_is_one_line(tmp_path: Path) -> None:
    root = _checkpoint_copy(tmp_path / "ckpt")
    config = (root / "config.json").read_text()
    (root / "config.json").write_text(config.replace('"hidden_size": 128', '"hidden_size": "128"'))
    res = _run("generate", "Hi", "--device", "cpu", "--model", str(root))
    _assert_one_line_error(res, "hidden_size", "integer")

    (root / "config.json").write_text(config)
    data = (root / "model.safetensors").read_bytes()
    (root / "model.safetensors").write_bytes(data[: len(data) // 2])
    res = _run("chat", "--device", "cpu", "--model", str(root), input="Hi\n")
    _assert_one_line_error(res, str(root / "model.safetensors"), "truncated")

    res = _run("generate", "Hi", "--device", "cpu", "--model", str(tmp_path / "nowhere"))
    _assert_one_line_error(res, "nowhere")


# -- chat input --------------------------------------------------------------------------------


def test_chat_ends_cleanly_without_input() -> None:
    closed = _run("chat", "--device", "cpu", preexec_fn=lambda: os.close(0))
    empty = _run("chat", "--device", "cpu", "--max-tokens", "4", stdin=subprocess.DEVNULL)
    for res in (closed, empty):
        assert res.returncode == 0, res.stderr
        assert "Traceback" not in res.stderr and "error" not in res.stderr


def test_chat_turn_error_is_reported_and_the_chat_goes_on() -> None:
    """A turn too long for the model is refused; the next turn is answered."""
    res = _run("chat", "--device", "cpu", "--max-tokens", "4", input="thou " * 5000 + "\nHi\n")
    assert res.returncode == 0 and "Traceback" not in res.stderr
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "max_model_len" in errors[0]
    assert res.stdout.count("model> ") == 1


# -- Ctrl-C --------------------------------------------------------------------------------------


def _interrupt_after_output(
    args: list[str], *, stdin: str | None, min_bytes: int
) -> tuple[int, bytes, str]:
    """Start the CLI, wait until it has streamed ``min_bytes`` of stdout, send SIGINT."""
    proc = subprocess.Popen(
        [*CLI, *args],
        stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=ENV,
    )
    try:
        if stdin is not None:
            assert proc.stdin is not None
            proc.stdin.write(stdin.encode())
            proc.stdin.flush()
        assert proc.stdout is not None
        seen = b""
        deadline = time.monotonic() + 120
        while len(seen) < min_bytes and time.monotonic() < deadline:
            ready, _, _ = select.select([proc.stdout], [], [], 1.0)
            if ready:
                chunk = os.read(proc.stdout.fileno(), 4096)
                assert chunk, "the CLI ended before it was interrupted"
                seen += chunk
        assert len(seen) >= min_bytes, seen
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, seen + out, err.decode()


def test_ctrl_c_during_generate_exits_130_without_traceback() -> None:
    prompt = "ROMEO:"
    code, out, err = _interrupt_after_output(
        [*("generate", prompt, "--device", "cpu", "--max-tokens", "4000")],
        stdin=None,
        min_bytes=len(prompt) + 20,
    )
    assert code == 130, err
    assert "Traceback" not in err and err.strip() == ""
    assert out.startswith(prompt.encode())


def test_ctrl_c_during_a_chat_reply_exits_130_without_traceback() -> None:
    code, out, err = _interrupt_after_output(
        ["chat", "--device", "cpu", "--max-tokens", "4000"],
        stdin="Speak, and at length.\n",
        min_bytes=len("you> model> ") + 20,
    )
    assert code == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert b"model> " in out


# -- help and version -------------------------------------------------------------------------


def test_every_option_has_help() -> None:
    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert set(subparsers.choices) == {"info", "generate", "chat", "bench"}
    commands = {c.dest: c.help for c in subparsers._choices_actions}
    assert all(commands.values()), commands
    for name, sub in [("deepinfer", parser), *subparsers.choices.items()]:
        for action in sub._actions:
            if isinstance(action, argparse._SubParsersAction):
                continue
            what = f"{name} {'/'.join(action.option_strings) or action.dest}"
            assert action.help and action.help != argparse.SUPPRESS, what
            assert action.help.strip(), what


def test_version() -> None:
    res = _run("--version")
    assert res.returncode == 0 and res.stderr == ""
    lines = res.stdout.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"deepinfer {metadata.version('deepinfer-core')} (")
    assert f"deepseek-recipe {metadata.version('deepseek-recipe')}" in lines[0]
    assert f"torch {metadata.version('torch')}" in lines[0]
