"""The Huawei Ascend backend (torch_npu).

Importing this module never imports torch_npu: without the CANN toolkit that import fails, and once
torch_npu is installed it is also loaded by ``import torch`` itself unless
``TORCH_DEVICE_BACKEND_AUTOLOAD=0``. The availability check imports it inside a guard and turns
every failure into a reason a person can act on.
"""

from __future__ import annotations

import importlib.util
from typing import ClassVar

from deepinfer.backends.base import Availability
from deepinfer.backends.torch_ref import TorchBackend

INSTALL_HINT = (
    "pip install 'deepinfer-kernels-ascend[npu]' on a host with the CANN toolkit "
    "(source its set_env.sh first)"
)


class AscendBackend(TorchBackend):
    """torch_npu ops on Ascend NPUs; torch reference ops for the rest."""

    name: ClassVar[str] = "ascend"
    device_types: ClassVar[tuple[str, ...]] = ("npu",)

    @classmethod
    def availability(cls) -> Availability:
        if importlib.util.find_spec("torch_npu") is None:
            return Availability(False, f"torch_npu is not installed: {INSTALL_HINT}")
        try:
            import torch
            import torch_npu  # noqa: F401
        except (ImportError, OSError, RuntimeError) as exc:
            return Availability(
                False, f"torch_npu failed to import ({exc}); is the CANN toolkit installed?"
            )
        if not torch.npu.is_available():  # type: ignore[attr-defined]
            return Availability(False, "torch_npu imported but no Ascend NPU is visible")
        return Availability(True)
