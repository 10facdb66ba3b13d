#!/bin/sh
# HalfSafe for Linux (and any terminal on macOS): sets everything up on the first start, then
# starts the app; later starts go straight to the app.
#   installer/halfsafe.sh                  open the window
#   installer/halfsafe.sh check demo       any arguments go on to the `halfsafe` command
#   installer/halfsafe.sh --setup-help     the setup options (--setup-only, --dev, --repair...)
#   installer/halfsafe.sh --test [ARGS]    set up for development and run the tests (run-tests.sh)
here=$(CDPATH= cd -- "$(dirname -- "$0")" && pwd) || exit 3

if [ "${1:-}" = "--test" ]; then
  shift
  exec bash "$here/run-tests.sh" "$@"
fi

# The first Python 3.10+ found; HALFSAFE_PYTHON names one outright.
python=""
for candidate in "${HALFSAFE_PYTHON:-}" python3 python3.14 python3.13 python3.12 python3.11 python3.10 python; do
  [ -n "$candidate" ] || continue
  command -v "$candidate" >/dev/null 2>&1 || continue
  if "$candidate" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' >/dev/null 2>&1; then
    python=$candidate
    break
  fi
done
if [ -z "$python" ]; then
  echo "HalfSafe needs Python 3.10 or newer and none was found: install it (Debian/Ubuntu: sudo apt install python3 python3-venv; others: https://www.python.org/downloads/) and run $0 again." >&2
  exit 3
fi

HALFSAFE_LAUNCHER=${HALFSAFE_LAUNCHER:-$0}
export HALFSAFE_LAUNCHER
exec "$python" "$here/bootstrap.py" "$@"
