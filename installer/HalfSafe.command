#!/bin/sh
# HalfSafe for macOS: double-click in Finder. The first start sets everything up (a few minutes,
# progress in this window); later starts open the app at once. The window may be closed once
# HalfSafe is up. Arguments go on to the `halfsafe` command: ./HalfSafe.command check demo
here=$(CDPATH= cd -- "$(dirname -- "$0")" && pwd) || exit 3

# Finder starts this without the shell's usual PATH additions, so look where Python installers
# put it too. /usr/bin/python3 is skipped unless the Command Line Tools are there: otherwise it
# only opens an installer dialog.
python=""
candidates="${HALFSAFE_PYTHON:-} python3.14 python3.13 python3.12 python3.11 python3.10 python3"
candidates="$candidates /opt/homebrew/bin/python3 /usr/local/bin/python3"
candidates="$candidates /Library/Frameworks/Python.framework/Versions/Current/bin/python3"
if xcode-select -p >/dev/null 2>&1; then candidates="$candidates /usr/bin/python3"; fi
for candidate in $candidates; do
  command -v "$candidate" >/dev/null 2>&1 || continue
  [ "$candidate" = python3 ] && [ "$(command -v python3)" = /usr/bin/python3 ] && ! xcode-select -p >/dev/null 2>&1 && continue
  if "$candidate" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' >/dev/null 2>&1; then
    python=$candidate
    break
  fi
done
if [ -z "$python" ]; then
  echo "HalfSafe needs Python 3.10 or newer and none was found: install it from https://www.python.org/downloads/macos/ (or 'brew install python'), then double-click HalfSafe.command again." >&2
  exit 3
fi

HALFSAFE_LAUNCHER=${HALFSAFE_LAUNCHER:-$0}
export HALFSAFE_LAUNCHER
exec "$python" "$here/bootstrap.py" --detach "$@"
