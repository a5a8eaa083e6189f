#!/usr/bin/env bash
# Install everything the full test suite needs on a fresh Debian/Ubuntu machine, lint (ruff), then run it.
# Extra arguments go to pytest (e.g. `bash scripts/test.sh -m "not browser"`).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v chromium >/dev/null 2>&1; then
  sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium fonts-dejavu-core >/dev/null
fi
python3 -m pip install -q -r requirements-dev.txt -c constraints.txt -e .
python3 -m ruff check .
python3 -m ruff format --check .
# Two workers (pytest-xdist): the browser and Ray tests go to one of them in turn, every other test
# file to whichever is free (tests/conftest.py); `bash scripts/test.sh -n 0` runs in one process.
python3 -m pytest -n 2 --dist loadgroup --durations=30 "$@"
