#!/bin/bash
# Every GPU figure HalfSafe records, in one run on a CUDA machine, most wanted first; each step
# is time-boxed, so a slow or failing one costs its own box and the rest still run.
#
#   bash benchmarks/gpu_round.sh OUT_DIR [SCALE]
#
# SCALE (default 1) multiplies every step's time box. OUT_DIR receives round.log and the
# JSON documents (each step's whole log stays in $LOGS): gpu.json (`halfsafe gpu --json`: the
# quirks table and the self-test), then the tests marked gpu, whole-job-memory-check.json and
# -generate.json (whole_job_memory.py --device cuda: SDXL's failing check and generation at
# 1024 px with no budget and under 4 GB, the allocator's peak of each), health-sd1.json (the
# check's time against a 20-step generation), probe-overhead-sd1.json (the check's recorder by
# its per-tensor reduction), predicted-cost-sd1.json (predicted against timed steps, what a
# cost model is fitted from) and generation-sdxl.json (the NaN watch's cost and the host syncs
# it adds). The two rounds' figures (2026-11-26, docs/benchmarks.md) set the boxes; they sum to
# 725 s, past one call's 600: SKIP names steps to leave out (SKIP="gpu generation-sdxl":
# figures the rounds already have), so a short lease goes to what is still missing.
set -u
out=${1:?usage: gpu_round.sh OUT_DIR [SCALE]}
scale=${2:-1}
logs=${LOGS:-/tmp/halfsafe-gpu-round}
mkdir -p "$out" "$logs"
cd "$(dirname "$0")/.." || exit 2
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
python=${PYTHON:-python3}

step() {  # step NAME SECONDS COMMAND...: run it, its output to NAME.log, then the log's tail
    local name=$1 limit=$(( $2 * scale )) began=$SECONDS
    shift 2
    case " ${SKIP:-} " in *" $name "*) echo "== $name: skipped"; return ;; esac
    echo "== $name (at most $limit s)"
    timeout "$limit" "$@" >"$logs/$name.log" 2>&1
    echo "== $name: exit $?, $(( SECONDS - began )) s"
    tail -n 40 "$logs/$name.log"
}

{
nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv || true
"$python" -c "import torch, diffusers, transformers; print(torch.__version__, diffusers.__version__, transformers.__version__)"
step gpu 45 "$python" -m app.cli gpu --json --retest
# The tests that need a CUDA device (`-m gpu`): autocast's norms, the watch's host syncs, the
# recorder's reduction keeping NaN and inf, fp16 accumulation's self-test row, the low-bit
# kernels against their fp32 reference, FLUX.3's and Anima's GPU paths.
# (pytest-qt is not there: its ini option would be a config warning, an error under the suite's
# filters.)
step gpu-tests 90 "$python" -m pytest -q -p no:cacheprovider -W ignore::pytest.PytestConfigWarning \
    -m gpu tests/core/test_autocast.py tests/core/test_generation.py tests/core/test_probe.py \
    tests/core/test_fp16_accumulation.py tests/core/test_lowbit_kernels.py \
    tests/core/test_flux3.py tests/core/test_anima.py
[ -s "$logs/gpu.log" ] && "$python" -c "import json, sys; t = open(sys.argv[1]).read(); json.dump(json.loads(t[t.index('{'):]), open(sys.argv[2], 'w'), indent=1)" "$logs/gpu.log" "$out/gpu.json"
# SDXL with an overflow planted in its UNet, at 1024 px: without a budget, and under 4 GB, where
# the UNet (4.8 GiB in fp16) must stream block by block.
whole=("$python" benchmarks/whole_job_memory.py --device cuda --models sdxl --kinds planted
    --budgets none,4 --size 1024 --steps 4 --keep /tmp/halfsafe-whole)
step whole-check 240 "${whole[@]}" --jobs check --json "$out/whole-job-memory-check.json"
step health-sd1 90 "$python" benchmarks/health_check.py --device cuda --models sd1 --dtype fp16 \
    --repeats 1 --json "$out/health-sd1.json"
# Which per-tensor reduction makes the check's recorder cheaper on this device.
step probe-overhead 40 "$python" benchmarks/probe_overhead.py --device cuda --models sd1 \
    --dtype fp16 --rounds 5 --json "$out/probe-overhead-sd1.json"
step whole-generate 100 "${whole[@]}" --jobs generate --json "$out/whole-job-memory-generate.json"
# The dtype table and the work counts against timed steps on this device: the figures a cost
# model is fitted from (the ratio of each plan's step to fp16's, predicted and timed).
step predicted-cost 70 "$python" benchmarks/predicted_cost.py --device cuda --model sd1 \
    --size 512 --rounds 3 --json "$out/predicted-cost-sd1.json"
step generation-sdxl 50 "$python" benchmarks/generation.py --device cuda --cases sdxl --runs 5 \
    --steps 20 --json "$out/generation-sdxl.json"
} 2>&1 | tee "$out/round.log"
