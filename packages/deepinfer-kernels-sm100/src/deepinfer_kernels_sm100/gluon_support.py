"""Whether this process can run the Gluon kernels (:mod:`.fp8_wgmma`, :mod:`.fp4_gluon`,
:mod:`.fp8_gluon`).

Gluon is Triton's explicit-layout dialect (Triton 3.5 and later); its API still changes
between releases, so the kernels run only under the releases they are written for, and never
in Triton's interpreter, which does not run Gluon. They are checked on Hopper (compute
capability 9.x) alone; elsewhere the Triton kernels serve.
"""

from __future__ import annotations

import os

import torch
import triton

from deepinfer_kernels_sm100.devices import capability_major

try:
    from triton.experimental import gluon  # noqa: F401

    HAVE_GLUON = True
except ImportError:  # pragma: no cover - older Triton: the Triton kernels serve
    HAVE_GLUON = False

#: Triton releases whose Gluon the kernels are written for: 3.6 ran them on the H200, CI
#: compiles them with 3.7.
GLUON_RELEASES = ("3.6.", "3.7.")
#: Whether this process can run them at all (read once, as the kernel modules read it when
#: their kernels are made).
READY = (
    HAVE_GLUON
    and triton.__version__.startswith(GLUON_RELEASES)
    and os.environ.get("TRITON_INTERPRET") != "1"
)


def on_hopper(device: torch.device) -> bool:
    """Whether the Gluon kernels can run on ``device``: :data:`READY` and a Hopper GPU."""
    return READY and capability_major(device) == 9
