#!/bin/bash
# Every GPU target HalfSafe holds, in two commands that each fit one call of at most 600 s on a
# CUDA machine; each step is time-boxed (a slow or failing step costs its own box and the rest
# still run), and the boxes of each half add up to at most 540 s (tests/benchmarks/
# test_gpu_round.py holds them to it).
#
#   bash benchmarks/gpu_round.sh check OUT       # the check's targets
#   bash benchmarks/gpu_round.sh generate OUT    # the generation's targets
#   bash benchmarks/gpu_round.sh check|generate OUT --device cpu --tiny   # the dry run
#
# check: a healthy SD1.5 check at 512 px after load beside the app's own 20-step generation
# (`health_check.py --generation app`), with the recorder's UNet stage against bare; the same
# for SDXL at 1024 px; SDXL with an fp16 overflow planted in its UNet, its milestones (first
# finding, proved fix, verdict) and its work counts; the cost model of a UNet step fitted from
# timed steps at several sizes (`cost_model.py`), projected for RTX 2060 and RTX 3060 class
# cards and written into docs/benchmarks.md's marked table.
# generate: the fix's stated cost against what the generation pays (`fix_cost_truth.py`), a layer
# fix's per-step cost (`island_guards.py`), the NaN watch on SD1.5 and SDXL (`generation.py`),
# option B on the GPU (`option_b.py`).
#
# Every model is built in memory with random weights at its published shapes: nothing is written
# to disk first. Each step writes OUT/<step>.json as soon as it has its figures (a step of several
# cases after each case), so a command cut short loses only the step it was in. OUT also gets
# round-<half>.log (with each step's wall and CPU seconds); each step's whole log stays in $LOGS.
# SCALE (default 1; 3 in the dry run on a CPU) multiplies every box; SKIP names steps to leave
# out; DOCS is the file the cost model's table is written into (default docs/benchmarks.md; the
# dry run writes a copy in OUT instead).
#
# The dry run (`--device cpu --tiny`): the same steps on the tests' tiny models at 64 px, a few
# denoising steps, one torch thread (a shared CPU's other work would stall every parallel
# region), in seconds a step; the test suite runs it.
set -u
half=${1:?usage: gpu_round.sh check|generate OUT [--device cpu] [--tiny]}
out=${2:?usage: gpu_round.sh check|generate OUT [--device cpu] [--tiny]}
shift 2
device=cuda
tiny=()
while [ $# -gt 0 ]; do
    case $1 in
        --device) device=${2:?--device needs a value}; shift 2 ;;
        --tiny) tiny=(--tiny); shift ;;
        *) echo "gpu_round.sh: unknown option $1" >&2; exit 2 ;;
    esac
done
case $half in check | generate) ;; *) echo "gpu_round.sh: the half is check or generate, not $half" >&2; exit 2 ;; esac
logs=${LOGS:-/tmp/halfsafe-gpu-round}
mkdir -p "$out" "$logs"
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/.." || exit 2
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
python=${PYTHON:-python3}
# No fix or setting remembered on this machine changes what a check or a generation runs.
home=$(mktemp -d)
export HALFSAFE_CONFIG_DIR=$home/config HALFSAFE_DATA_DIR=$home/data HALFSAFE_CACHE_DIR=$home/cache

if [ ${#tiny[@]} -gt 0 ]; then
    sd1_px=64 sdxl_px=64 steps=3 repeats=1 runs=1 rounds=2 pairs=1 sd1_case=sd1-tiny-64px
    # A CPU shared with other work may run a step several times slower than it does alone.
    [ "$device" = cpu ] && export OMP_NUM_THREADS=1 && scale=${SCALE:-3}
    docs=${DOCS:-$out/benchmarks.md}
    [ -e "$docs" ] || cp docs/benchmarks.md "$docs"
else
    sd1_px=512 sdxl_px=1024 steps=20 repeats=3 runs=3 rounds=5 pairs=2 sd1_case=sd1-size-512px
    docs=${DOCS:-docs/benchmarks.md}
fi
scale=${scale:-${SCALE:-1}}
on=(--device "$device" "${tiny[@]}")

step() {  # step NAME SECONDS COMMAND...: run it, its output to NAME.log, then the log's tail
    local name=$1 limit=$(( $2 * scale )) began=$SECONDS rc
    local TIMEFORMAT="== $name: %R s wall, %U s user, %S s sys"
    shift 2
    case " ${SKIP:-} " in *" $name "*) echo "== $name: skipped"; return ;; esac
    echo "== $name (at most $limit s)"
    time timeout "$limit" "$@" >"$logs/$name.log" 2>&1
    rc=$?
    echo "== $name: exit $rc, $(( SECONDS - began )) s"
    tail -n 30 "$logs/$name.log"
}

check_half() {
    local health=("$python" benchmarks/health_check.py "${on[@]}" --dtype fp16 --steps "$steps"
        --generation app)
    step health-sd1 75 "${health[@]}" --models sd1 --size "$sd1_px" --repeats "$repeats" \
        --json "$out/health-sd1.json"
    step health-sdxl 100 "${health[@]}" --models sdxl --size "$sdxl_px" --repeats "$repeats" \
        --json "$out/health-sdxl.json"
    step planted-sdxl 180 "${health[@]}" --models sdxl --size "$sdxl_px" --plant --repeats 1 \
        --hook-repeats 1 --json "$out/planted-sdxl.json"
    step cost-model 100 "$python" benchmarks/cost_model.py "${on[@]}" --rounds "$rounds" \
        --json "$out/cost-model.json" --docs "$docs"
}

generate_half() {
    step fix-cost-truth 120 "$python" benchmarks/fix_cost_truth.py "${on[@]}" --model sd1 \
        --size "$sd1_px" --steps "$steps" --pairs "$pairs" --json "$out/fix-cost-truth.json"
    step island-guards 60 "$python" benchmarks/island_guards.py "${on[@]}" --model sd1 \
        --size "$sd1_px" --rounds "$rounds" --json "$out/island-guards.json"
    step watch-sd1 60 "$python" benchmarks/generation.py "${on[@]}" --cases sd1 --runs "$runs" \
        --steps "$steps" --json "$out/watch-sd1.json"
    step watch-sdxl 120 "$python" benchmarks/generation.py "${on[@]}" --cases sdxl \
        --runs "$runs" --steps "$steps" --json "$out/watch-sdxl.json"
    # The SD1.5-size plant first, then the tiny SD model's plants that fail in its UNet.
    step option-b 90 "$python" benchmarks/option_b.py "${on[@]}" --model sd1 --size "$sd1_px" \
        --only "$sd1_case,sd-unet_ff,sd-attention,sd-between_layers" --json "$out/option-b.json"
}

{
echo "== the $half half on $device${tiny:+ (tiny)}, $(date -u +%FT%TZ)"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv
"$python" -c "import torch, diffusers, transformers; print(torch.__version__, diffusers.__version__, transformers.__version__)"
"${half}_half"
} 2>&1 | tee "$out/round-$half.log"
rm -rf "$home"
