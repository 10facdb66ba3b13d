#!/usr/bin/env bash
# The test command: on a fresh Debian/Ubuntu machine, install the system packages the tests need,
# set HalfSafe up through the launcher's bootstrap (with the test tools), then run lint, the
# import rules and every test, the slow ones included.
#   installer/halfsafe.sh --test [pytest args...]     (the launcher hands over to this script)
# HALFSAFE_TORCH_SPEC chooses the torch build (default torch==2.13.0, the CPU wheel here).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here/.."

say() { printf 'run-tests: %s\n' "$*"; }

# Qt's offscreen and xcb platforms, Xvfb for screenshots, xdotool for real input under it.
packages=(xvfb xauth xdotool libxcb-icccm4 libxcb-keysyms1 libxcb-cursor0 libxkbcommon-x11-0 libegl1 libgl1 libfontconfig1 libdbus-1-3)
missing=()
for p in "${packages[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  say "installing system packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

export HALFSAFE_TORCH_SPEC="${HALFSAFE_TORCH_SPEC:-torch==2.13.0}"
# The test environments' installs write no bytecode for the 13,000 modules they unpack
# (ComfyUI's requirements with torch: 51.1 s with it, 30.2 s without, on a 2-core AMD EPYC): the
# modules the tests import compile when first imported. Only for the installs below: the
# launcher's own tests install as a user's does.
quick_pip=(env PIP_COMPILE=0)  # pip reads it as --compile off (PIP_NO_COMPILE=1 would turn it on)

# ComfyUI for the node package's tests (tests/comfyui): its source from ../shared/vendor and a
# second environment like a user's ComfyUI one (its pure-Python requirements, HalfSafe installed
# there without the window). Cached in .comfyui-test/ (ignored by git; HALFSAFE_COMFYUI_CACHE
# names another folder) until the archive, the requirements or the torch build change. Without
# the archive those tests are skipped. Its packages install while HalfSafe's own do (two pips
# on two cores: 189 s for both, against about 400 s one after the other); HalfSafe itself goes
# in once its own set-up is done, so that the two never build from this tree at once.
comfy_archive="../shared/vendor/comfyui-0.29.0-4f874c5.tar.gz"
comfy_cache="$(realpath -m "${HALFSAFE_COMFYUI_CACHE:-.comfyui-test}")"
comfy_pid=""
if [ -f "$comfy_archive" ]; then
  comfy_stamp="$(cat "$comfy_archive" pyproject.toml comfyui-halfsafe/pyproject.toml | sha256sum | cut -c1-16) $HALFSAFE_TORCH_SPEC"
  if [ "$(cat "$comfy_cache/ready" 2>/dev/null)" != "$comfy_stamp" ]; then
    say "setting up ComfyUI for the node package's tests in $comfy_cache/ (beside HalfSafe's set-up)"
    comfy_started=$SECONDS
    rm -rf "$comfy_cache"
    mkdir -p "$comfy_cache"
    # The Python the launcher takes (installer/halfsafe.sh): the first 3.10 or newer.
    comfy_base=""
    for candidate in "${HALFSAFE_PYTHON:-}" python3 python3.14 python3.13 python3.12 python3.11 python3.10 python; do
      [ -n "$candidate" ] && command -v "$candidate" >/dev/null 2>&1 || continue
      if "$candidate" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' >/dev/null 2>&1; then
        comfy_base=$candidate
        break
      fi
    done
    (
      tar -xzf "$comfy_archive" -C "$comfy_cache"
      "${comfy_base:?no Python 3.10 or newer}" -m venv "$comfy_cache/venv"
      # torchvision/torchaudio have no CPU build for this torch (the tests stand in for them,
      # import-only); the web frontend, templates and OpenGL are not needed here.
      grep -v -E '^(torch|torchvision|torchaudio|comfyui-frontend-package|comfyui-workflow-templates|comfyui-embedded-docs|PyOpenGL|comfy-angle)([<>=~ ]|$)|^#|^\s*$' \
        "$comfy_cache/ComfyUI/requirements.txt" >"$comfy_cache/requirements.txt"
      torch_index=()
      [ -n "${HALFSAFE_TORCH_INDEX:-}" ] && torch_index=(--extra-index-url "$HALFSAFE_TORCH_INDEX")
      # torch pinned in the same pip command as everything else: no requirement can then make
      # pip take another build (a CUDA one brings gigabytes of nvidia-* packages).
      "${quick_pip[@]}" "$comfy_cache/venv/bin/python" -m pip install -q "${torch_index[@]}" "$HALFSAFE_TORCH_SPEC" \
        -r "$comfy_cache/requirements.txt"
    ) >"$comfy_cache/pip.log" 2>&1 &
    comfy_pid=$!
  fi
fi

say "setting up HalfSafe with $HALFSAFE_TORCH_SPEC and the test tools"
"${quick_pip[@]}" sh installer/halfsafe.sh --setup-only --dev
venv="$(sh installer/halfsafe.sh --where)"
bin="$venv/bin"

if [ -n "$comfy_pid" ]; then
  if ! wait "$comfy_pid"; then
    tail -n 40 "$comfy_cache/pip.log"
    say "ComfyUI's test environment did not set up (above, the end of $comfy_cache/pip.log)"
    exit 1
  fi
  comfy_python="$comfy_cache/venv/bin/python"
  # HalfSafe's own requirements, with the torch build pinned again.
  "${quick_pip[@]}" "$comfy_python" -m pip install -q "$HALFSAFE_TORCH_SPEC" . 2>&1 | tee -a "$comfy_cache/pip.log"
  # The very torch build HalfSafe's environment holds ("2.13.0+cpu"): CUDA's runtime comes as
  # nvidia-* packages (nvidia-ml-py is only NVML's Python binding, which HalfSafe itself
  # requires), and a CPU torch names no CUDA version.
  theirs="$("$comfy_python" -c 'import torch; print(torch.__version__, torch.version.cuda or "")')"
  ours="$("$bin/python" -c 'import torch; print(torch.__version__, torch.version.cuda or "")')"
  nvidia="$("$comfy_python" -m pip list --format=freeze | grep -i '^nvidia-' | grep -vi '^nvidia-ml-py=' || true)"
  if [ "$theirs" != "$ours" ] || [ -n "$nvidia" ]; then
    say "ComfyUI's test environment took torch $theirs ${nvidia//$'\n'/ } where HalfSafe's has $ours: refusing it"
    exit 1
  fi
  printf '%s' "$comfy_stamp" >"$comfy_cache/ready"
  say "ComfyUI's test environment set up in $((SECONDS - comfy_started)) s"
fi
if [ -f "$comfy_cache/ready" ] && [ -f "$comfy_archive" ]; then
  # HalfSafe as a user's ComfyUI gets it: a regular install, not an editable one (whose import
  # hook would hide that ComfyUI's own `app` package shadows HalfSafe's), made again each run
  # from this tree (without its dependencies: they are there), so the tests run today's core;
  # a set-up just above has installed this very tree already.
  if [ -z "$comfy_pid" ]; then
    "${quick_pip[@]}" "$comfy_cache/venv/bin/python" -m pip install -q --no-deps --force-reinstall --no-build-isolation .
  fi
  export HALFSAFE_COMFYUI="$comfy_cache/ComfyUI"
  export HALFSAFE_COMFYUI_PYTHON="$comfy_cache/venv/bin/python"
fi

say "lint and import rules"
lint_paths=()
for d in app tests installer benchmarks tools; do [ -d "$d" ] && lint_paths+=("$d"); done
"$bin/ruff" check "${lint_paths[@]}"
"$bin/lint-imports"
say "types (pyright, standard, over app/; see [tool.pyright] in pyproject.toml)"
"$bin/pyright" --pythonpath "$bin/python"

# The tests run on every core (pytest-xdist; `-n auto` is one worker per core): they are
# independent of each other and of the order they run in. The slowest are listed at the end,
# so that the run's time stays in view. (Not `--dist loadgroup`: it hands the tests out one
# at a time, and each worker then set up the ComfyUI tests' module fixtures, a released-width
# file's run each, again: twice the time.)
parallel=(-n auto --durations=25)

say "tests"
set +e
# pyproject's addopts leave the slow tests out of a developer's run; here every test runs.
"$bin/python" -m pytest -m "slow or not slow" "${parallel[@]}" "$@"
status=$?
set -e
# pytest's 5 means no tests ran: a broken test run, not a pass.
[ $status -eq 5 ] && say "no tests ran" && exit 1
[ $status -ne 0 ] && exit $status

# The suite pins the CPU's bf16 class to "native" (tests/conftest.py), so its answers do not
# depend on this machine. The core tests run again as on a CPU without native bf16, so that the
# other branch (fixes kept in fp32, not bf16) runs on every machine too.
# Only the modules whose answers can depend on that class run again: devices and their
# recommendations, precision plans, the fix search and verdicts, generation's repairs, the
# explanation's advice and the commands that print them, and every family's check and repair
# (the conformance suite, pictures and editing), and the golden check reports of the demos and
# the tiny SD corpus. Reading files, the library, settings, words
# and each family's own file layouts do not depend on it, nor do the tests in those modules
# marked `class_free` (loading, healthy runs: no fix is chosen), which it leaves out.
bf16_dependent=()
for name in hardware gpu_command selftest precision autocast islands health verdicts causes \
  generation explain explain_lora profiles cli families pictures edit intermittent \
  memory_budget streaming vae_tiling advice golden_reports; do
  for folder in tests/core tests/unit; do
    [ -f "$folder/test_$name.py" ] && bf16_dependent+=("$folder/test_$name.py")
  done
done
say "the bf16-dependent core tests again as on a CPU without native bf16 (HALFSAFE_CPU_BF16=emulated)"
set +e
HALFSAFE_CPU_BF16=emulated "$bin/python" -m pytest -q -m "not slow and not class_free" -p no:cacheprovider \
  "${parallel[@]}" "${bf16_dependent[@]}"
status=$?
set -e
[ $status -eq 5 ] && say "no tests ran" && exit 1
exit $status
