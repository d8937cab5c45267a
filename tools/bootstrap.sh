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
pip=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check)
"${pip[@]}" --upgrade pip
"${pip[@]}" "$torch_spec"
"${pip[@]}" -r tools/requirements-dev.txt
editables=()
for m in "${members[@]}"; do editables+=(-e "packages/$m"); done
"${pip[@]}" "${editables[@]}"
echo "$want" > "$stamp"
echo "bootstrap: ready ($("$venv/bin/python" -c 'import torch; print("torch", torch.__version__)'))" >&2
