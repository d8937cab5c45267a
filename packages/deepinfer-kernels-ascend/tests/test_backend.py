from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from deepinfer import plugins
from deepinfer.errors import BackendUnavailableError
from deepinfer_kernels_ascend.backend import AscendBackend


def test_registered_under_backends() -> None:
    assert plugins.backends.load("ascend") is AscendBackend


def test_import_does_not_pull_torch_npu() -> None:
    code = (
        "import sys, deepinfer_kernels_ascend.backend;"
        "assert 'torch_npu' not in sys.modules, 'torch_npu imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_without_torch_npu_the_error_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: None)
    avail = AscendBackend.availability()
    assert not avail.ok
    assert "pip install 'deepinfer-kernels-ascend[npu]'" in avail.reason
    assert "CANN" in avail.reason
    with pytest.raises(BackendUnavailableError, match="backend 'ascend' cannot run here"):
        AscendBackend()


def test_torch_npu_without_cann_is_reported_not_raised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What torch_npu does on a machine without the CANN toolkit: its import fails in the loader.
    pkg = tmp_path / "torch_npu"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        "raise ImportError('libhccl.so: cannot open shared object file: No such file')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "torch_npu", raising=False)
    avail = AscendBackend.availability()
    assert not avail.ok
    assert "libhccl.so" in avail.reason
    assert "CANN toolkit" in avail.reason


@pytest.mark.npu
def test_runs_on_npu() -> None:
    assert AscendBackend().device.type == "npu"
