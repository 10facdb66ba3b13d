#!/usr/bin/env bash
# Set up everything HalfSafe's tests need on a fresh Debian/Ubuntu machine, then run them all.
#   bash installer/run-tests.sh [pytest args...]
# HALFSAFE_TORCH_SPEC chooses the torch build (default torch==2.13.0, the CPU wheel here).
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf 'run-tests: %s\n' "$*"; }

# Qt's offscreen and xcb platforms, and Xvfb for screenshots.
packages=(xvfb xauth libxcb-icccm4 libxcb-keysyms1 libxcb-cursor0 libxkbcommon-x11-0 libegl1 libgl1 libfontconfig1 libdbus-1-3)
missing=()
for p in "${packages[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  say "installing system packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  say "creating .venv"
  "$python" -m venv .venv
fi
say "installing HalfSafe and its test tools"
.venv/bin/python -m pip install -q --disable-pip-version-check \
  "${HALFSAFE_TORCH_SPEC:-torch==2.13.0}" -e ".[dev]"

say "lint and import rules"
.venv/bin/ruff check app tests installer benchmarks
.venv/bin/lint-imports

say "tests"
set +e
.venv/bin/python -m pytest "$@"
status=$?
set -e
# pytest's 5 means no tests ran: a broken test run, not a pass.
[ $status -eq 5 ] && say "no tests ran" && exit 1
exit $status
