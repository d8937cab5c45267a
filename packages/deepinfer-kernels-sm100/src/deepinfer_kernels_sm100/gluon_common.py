"""Device helpers the Gluon decode kernels (:mod:`.fp8_gluon`, :mod:`.fp4_gluon`) share: their
one-element-a-thread layout, and programmatic dependent launch (PDL) with their weights asked of
L2 ahead of the wait.

A decode step is a chain of short kernels, each waiting on the last. A kernel launched with
``launch_pdl=True`` may start while the kernel before it still runs, as that one's programs
call :func:`grid_dependency` (``launch_dependents``) or finish; it must then wait
(``griddepcontrol.wait``) before it reads anything the earlier kernel writes. The weights of a
linear are written by no kernel of the step, so its programs can ask L2 for them first
(:func:`prefetch_rows`) and wait only before the activations: the weight stream starts while
the previous kernel drains, and the launch's latency is hidden. Both instructions do nothing
in a kernel launched without PDL.
"""

from __future__ import annotations

from typing import Any

try:  # Gluon ships with Triton 3.5 and later
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl

    HAVE_GLUON = True
except ImportError:  # pragma: no cover - older Triton: the Triton kernels serve
    HAVE_GLUON = False

if HAVE_GLUON:

    @gluon.constexpr_function
    def lanes(split_k: Any, warps_n: Any) -> Any:
        """[split_k, 32 warps_n], one element a thread: warp (ks, wn) lane l holds
        (ks, 32 wn + l). A tensor of this layout is one register of a known lane."""
        return gl.BlockedLayout([1, 1], [1, 32], [split_k, warps_n], [1, 0])

    @gluon.jit
    def grid_dependency(t, WAIT: gl.constexpr):
        """Let the next kernel launch (it may start as this one's programs finish), or, with
        WAIT, wait for every write of the previous kernel. ``t``: any tensor of the program's
        layout (one instruction a thread)."""
        op: gl.constexpr = "wait" if WAIT else "launch_dependents"
        asm: gl.constexpr = "griddepcontrol." + op + "; // $0 $1"
        gl.inline_asm_elementwise(asm, "=r,r", (t,), dtype=gl.int32, is_pure=False, pack=1)

    @gluon.jit
    def prefetch_rows(rows, t, nbytes):
        """Ask L2 for ``nbytes`` from each pointer tensor of ``rows`` (a row's first byte in
        each thread of its quad): lane ``t`` (0..3) of the quad takes the 128-byte lines
        4i + t, each address kept inside the row."""
        for r in gl.static_range(len(rows)):
            for j in range(0, nbytes, 512):
                at = rows[r] + gl.minimum(j + 128 * t, nbytes - 1)[None, :]
                gl.inline_asm_elementwise("prefetch.global.L2 [$1]; // $0", "=r,l", (at,),
                                          dtype=gl.int32, is_pure=False, pack=1)  # fmt: skip
