#!/usr/bin/env bash
# Set up the development environment: a virtual environment in .venv (unless one is active),
# the CPU build of torch where no torch is installed, then the workbench with its dev extras.
# Idempotent and quick when nothing changed.
#   TORCH_SPEC       torch requirement installed when torch is missing (default: torch==2.13.0)
#   TORCH_INDEX_URL  extra index to take torch from (for example PyTorch's CPU wheel index)
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -n "${VIRTUAL_ENV:-}" ]; then
  PY="$VIRTUAL_ENV/bin/python"
else
  if [ ! -x .venv/bin/python ]; then
    echo "setup: creating .venv"
    "${PYTHON:-python3}" -m venv .venv
  fi
  PY=.venv/bin/python
fi

if ! "$PY" -c "import torch" >/dev/null 2>&1; then
  spec="${TORCH_SPEC:-torch==2.13.0}"
  echo "setup: installing $spec (CPU build)"
  if [ -n "${TORCH_INDEX_URL:-}" ]; then
    "$PY" -m pip install -q --extra-index-url "$TORCH_INDEX_URL" "$spec"
  else
    "$PY" -m pip install -q "$spec"
  fi
fi

stamp="$(dirname "$PY")/../.workbench-setup"
want="$(cat pyproject.toml | sha256sum | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ] || ! "$PY" -c "import workbench" >/dev/null 2>&1; then
  echo "setup: installing workbench[dev] (first run takes a minute or two)"
  "$PY" -m pip install -q --upgrade pip >/dev/null
  "$PY" -m pip install -q -e ".[dev]"
  echo "$want" > "$stamp"
fi
# The browser tests drive Debian's chromium through Playwright (never `playwright install`: its
# browser download is not used). Installed here when missing and we may use apt (root, Debian);
# elsewhere those tests are skipped with the reason. WORKBENCH_NO_APT=1 skips this step.
if ! command -v chromium >/dev/null 2>&1 && [ -z "${WORKBENCH_NO_APT:-}" ] \
   && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "setup: installing Debian's chromium for the browser tests"
  if ! (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null); then
    if [ -n "${CI:-}" ]; then
      echo "setup: could not install chromium, which CI's browser tests need" >&2
      exit 1
    fi
    echo "setup: could not install chromium; browser tests will be skipped"
  fi
fi
echo "setup: ready ($("$PY" -c 'import sys, torch; print(f"python {sys.version.split()[0]}, torch {torch.__version__}")'))"
