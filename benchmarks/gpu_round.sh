#!/bin/bash
# Every GPU figure HalfSafe records, in one run on a CUDA machine, most wanted first; each step
# is time-boxed, so a slow or failing one costs its own box and the rest still run.
#
#   bash benchmarks/gpu_round.sh OUT_DIR [SCALE]
#
# SCALE (default 1) multiplies every step's time box. OUT_DIR receives one log per step and the
# JSON documents: gpu.json (`halfsafe gpu --json`: the quirks table and the self-test),
# whole-job-memory-cuda.json (whole_job_memory.py --device cuda: SDXL's checks and generations
# at 1024 px with and without a 6 GB budget, the allocator's peak of each), health-gpu.json
# (the check's time against a 20-step generation) and generation-gpu.json (the NaN watch's
# cost and the host syncs it adds), the last two at SD1.5 and SDXL size in fp16.
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
    echo "== $name (at most $limit s)"
    timeout "$limit" "$@" >"$logs/$name.log" 2>&1
    echo "== $name: exit $?, $(( SECONDS - began )) s"
    tail -n 40 "$logs/$name.log"
}

{
nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv || true
"$python" -c "import torch, diffusers, transformers; print(torch.__version__, diffusers.__version__, transformers.__version__)"
step gpu 45 "$python" -m app.cli gpu --json --retest
"$python" -c "import json, sys; t = open(sys.argv[1]).read(); json.dump(json.loads(t[t.index('{'):]), open(sys.argv[2], 'w'), indent=1)" "$logs/gpu.log" "$out/gpu.json"
whole=("$python" benchmarks/whole_job_memory.py --device cuda --models sdxl --size 1024 --steps 4
    --keep /tmp/halfsafe-whole --json "$out/whole-job-memory-cuda.json")
step whole-check 190 "${whole[@]}" --jobs check
for model_limit in sd1:40 sdxl:60; do
    model=${model_limit%:*} limit=${model_limit#*:}
    step "health-$model" "$limit" "$python" benchmarks/health_check.py --device cuda \
        --models "$model" --dtype fp16 --repeats 3 --json "$out/health-$model.json"
done
for model in sd1 sdxl; do
    step "generation-$model" 50 "$python" benchmarks/generation.py --device cuda --cases "$model" \
        --runs 3 --steps 20 --json "$out/generation-$model.json"
done
step whole-generate 110 "${whole[@]}" --jobs generate --append
} 2>&1 | tee "$out/round.log"
