"""How a data-parallel run starts and fails to start: under torchrun, and spawned from rank 0.

Under ``torchrun`` (two processes on this CPU, gloo, ``env://``) rank 0's greedy outputs must
equal the single-process engine's token for token, and the other rank must never get past
``LLM(...)`` yet exit cleanly once rank 0 ends the run. A start-up that fails on any rank (a
checkpoint whose experts only one rank reads, or a worker killed or stopped on its way to the
group) must raise on rank 0 within seconds, with the failing rank and its error named, and
leave no process and no process group behind.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from _dp_launch import GREEDY, OPTIONS, PROMPTS, malformed_checkpoint, spawned_children, tokens

from deepinfer import LLM
from deepinfer.dp.group import DataParallelError, threads_per_rank
from deepinfer.dp.options import DataParallelOptions
from deepinfer.models.errors import CheckpointError

SCRIPT = Path(__file__).with_name("_dp_launch.py")
#: Ample for a start-up that fails: what a hang would run into is dp_timeout_s, far above it.
FAIL_WITHIN_S = 30.0
TORCHRUN_TIMEOUT_S = 120.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def torchrun(out: Path, model: str) -> subprocess.CompletedProcess[str]:
    """Two ranks of ``_dp_launch.py`` under torchrun; the whole process group is killed if it
    outlives ``TORCHRUN_TIMEOUT_S``, so no rank outlives the test."""
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    command += ["--master-port", str(_free_port()), str(SCRIPT), str(out), model]
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        stdout, _ = proc.communicate(timeout=TORCHRUN_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return subprocess.CompletedProcess(command, proc.returncode, stdout)


def test_torchrun_ranks_equal_one_process(tmp_path: Path) -> None:
    want = tokens(LLM("tiny", **OPTIONS).generate(PROMPTS, GREEDY, use_tqdm=False))
    run = torchrun(tmp_path, "tiny")
    assert run.returncode == 0, run.stdout[-4000:]
    result = json.loads((tmp_path / "rank0.json").read_text())
    assert result["tokens"] == want
    assert result["rank"] == 0 and all(s > 0 for s in result["steps"])  # both ranks stepped
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank0.json"]  # rank 1 never returned


def test_torchrun_rank_failing_to_start_fails_rank_0(tmp_path: Path) -> None:
    model = malformed_checkpoint(tmp_path / "model", expert=5)  # rank 1's
    run = torchrun(tmp_path, str(model))
    assert run.returncode != 0
    own = (tmp_path / "error1.txt").read_text()
    assert own.startswith("CheckpointError: tensor 'layers.0.ffn.experts.5.w1.weight'")
    told = (tmp_path / "error0.txt").read_text()
    assert told.startswith("DataParallelError: data-parallel start-up failed: rank 1 (")
    assert own in told


def _assert_nothing_left(started: float) -> None:
    assert time.monotonic() - started < FAIL_WITHIN_S
    assert mp.active_children() == []
    assert spawned_children() == []
    assert not dist.is_initialized()


def test_a_worker_failing_to_start_fails_rank_0(tmp_path: Path) -> None:
    model = malformed_checkpoint(tmp_path, expert=5)  # only rank 1 reads it
    started = time.monotonic()
    with pytest.raises(DataParallelError, match="start-up failed: rank 1 ") as caught:
        LLM(str(model), dtype="float32", data_parallel_size=2, enable_expert_parallel=True)
    assert "CheckpointError: tensor 'layers.0.ffn.experts.5.w1.weight'" in str(caught.value)
    _assert_nothing_left(started)


def test_rank_0_failing_to_start_ends_the_workers(tmp_path: Path) -> None:
    """Rank 0's own error, as one process would raise it; the worker, which built its engine,
    is ended rather than left waiting for steps."""
    model = malformed_checkpoint(tmp_path, expert=1)  # only rank 0 reads it
    started = time.monotonic()
    with pytest.raises(CheckpointError, match=r"layers\.0\.ffn\.experts\.1\.w1\.weight"):
        LLM(str(model), dtype="float32", data_parallel_size=2, enable_expert_parallel=True)
    _assert_nothing_left(started)


@pytest.mark.parametrize(
    ("how", "said"),
    [("kill", "rank 1 exited with code -9"), ("freeze", "rank 1 still starting after")],
    ids=["kill", "freeze"],
)
def test_a_worker_lost_on_its_way_ends_the_start(how: str, said: str) -> None:
    """Killed (or stopped) as soon as it exists, the worker never joins the group: rank 0 must
    see it at once (or after ``dp_timeout_s`` for a hung one), not hang in the join."""
    timeout_s = 120.0 if how == "kill" else 3.0

    def lose_first_worker() -> None:
        deadline = time.monotonic() + FAIL_WITHIN_S
        while time.monotonic() < deadline:
            for pid in spawned_children():
                os.kill(pid, signal.SIGKILL if how == "kill" else signal.SIGSTOP)
                return
            time.sleep(0.005)

    thread = threading.Thread(target=lose_first_worker)
    thread.start()
    started = time.monotonic()
    try:
        with pytest.raises(DataParallelError, match=said):
            LLM("tiny", data_parallel_size=2, enable_expert_parallel=True, dp_timeout_s=timeout_s)
    finally:
        thread.join()
    _assert_nothing_left(started)


def test_threads_are_shared_among_spawned_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    two = DataParallelOptions(data_parallel_size=2)
    torch.set_num_threads(5)  # the autouse fixture restores the count
    assert threads_per_rank(two, None) == 2
    assert threads_per_rank(two, 3) == 3  # asked for: kept
    assert threads_per_rank(DataParallelOptions(), None) is None  # one process: torch's own
    assert threads_per_rank(DataParallelOptions(data_parallel_size=8), None) == 1
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert threads_per_rank(two, None) is None  # torchrun's OMP_NUM_THREADS stands
