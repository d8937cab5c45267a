"""Keeps an idle data-parallel run alive: rank 0 exchanges a no-op command when no step has
run for a while.

A rank above 0 waits for rank 0's next command inside a collective, and every collective is
bounded by ``dp_timeout_s`` (that bound is what finds a dead or hung rank). A caller that runs
no step for that long (a server between requests, a notebook) would end the run. So while
the run is idle, a thread on rank 0 sends every rank a keep-alive command (no step, no
forward) a few times per timeout; it takes the front end's exchange lock, so it never
interleaves with a step's collectives. A rank that died or hung meanwhile is found by the
keep-alive's own exchange, which ends the run as a step would: the next call raises.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from typing import Protocol

import torch

logger = logging.getLogger(__name__)

#: Keep-alive exchanges per ``dp_timeout_s`` of idleness.
PER_TIMEOUT = 4


class Pingable(Protocol):
    """What the keep-alive needs of the front end."""

    last_exchange: float
    lock: threading.RLock

    def ping(self) -> None: ...

    def is_over(self) -> bool: ...


class KeepAlive:
    """A daemon thread pinging the ranks of ``engine`` (held weakly: the front end's garbage
    collection still ends the run) while it is idle for ``timeout_s / PER_TIMEOUT``."""

    def __init__(self, engine: Pingable, timeout_s: float, cuda_device: int | None) -> None:
        self.interval = timeout_s / PER_TIMEOUT
        self.stopped = threading.Event()
        self._thread = threading.Thread(
            target=self._run,
            args=(weakref.ref(engine), cuda_device),
            name="deepinfer-dp-keepalive",
            daemon=True,
        )
        self._thread.start()

    def stop(self) -> None:
        self.stopped.set()

    def _run(self, ref: weakref.ref[Pingable], cuda_device: int | None) -> None:
        if cuda_device is not None:  # NCCL's object collectives run on the current device
            torch.cuda.set_device(cuda_device)
        while not self.stopped.wait(self.interval / 2):
            engine = ref()
            if engine is None or engine.is_over():
                return
            with engine.lock:
                idle = time.monotonic() - engine.last_exchange >= self.interval
                if idle and not engine.is_over():
                    try:
                        engine.ping()
                    except BaseException as exc:  # the run is over; the next call raises
                        logger.warning("data-parallel keep-alive ended the run: %r", exc)
                        return
            del engine
