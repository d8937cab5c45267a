#!/usr/bin/env bash
# Sets up .venv with a CPU torch and every workspace package installed editable.
#
# Idempotent and quick on a second run: the install is skipped while the inputs that shape the
# environment (pyproject files, requirements, this script) are unchanged.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
venv="${DEEPINFER_VENV:-$root/.venv}"
python="${PYTHON:-python3}"
# torch 2.13.0's CPU wheel; an unpinned torch would pull a multi-GB CUDA build.
torch_spec="${DEEPINFER_TORCH:-torch==2.13.0}"

members=(deepseek-recipe deepinfer-core deepinfer-kernels-sm100 deepinfer-kernels-ascend
         deepinfer-spec deepinfer-structured deepinfer)

stamp="$venv/.deepinfer-bootstrap"
want="$(cat tools/bootstrap.sh tools/requirements-dev.txt pyproject.toml packages/*/pyproject.toml \
        | sha256sum | cut -d' ' -f1) $torch_spec"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$venv/bin/python" ]; then
  exit 0
fi

echo "bootstrap: creating $venv" >&2
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
# A stalled download from the public index is a read timeout that pip's own retries do not cover:
# each install gets three attempts.
pip_install() {
  local attempt
  for attempt in 1 2 3; do
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --retries 5 --timeout 60 \
      "$@" && return 0
    echo "bootstrap: pip install failed (attempt $attempt of 3)" >&2
    sleep $((attempt * 5))
  done
  return 1
}
pip_install --upgrade pip
pip_install "$torch_spec"
pip_install -r tools/requirements-dev.txt
editables=()
for m in "${members[@]}"; do editables+=(-e "packages/$m"); done
pip_install "${editables[@]}"
echo "$want" > "$stamp"
echo "bootstrap: ready ($("$venv/bin/python" -c 'import torch; print("torch", torch.__version__)'))" >&2
