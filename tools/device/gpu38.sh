#!/usr/bin/env bash
# Issue 38 on a lent GPU machine, within 240 s of wall time in all (run_all.sh kills it at 250):
#   1. makes a captioning (JPEG) and a text workload in /tmp with the repo's generators, in parallel;
#   2. pixels: nvJPEG (DeviceImageDecoder) against the CPU decoder, on the workload's JPEGs and on
#      4:4:4 / 4:2:2 / 4:2:0 / progressive / grayscale re-encodings (bench_gpu_decode.py --pixels);
#   3. throughput through the loader as a training loop uses it, in the same run: decoding in the
#      workers (uint8 batches, .to(device), ImageNormalizer) against workers that hand over the JPEG
#      bytes and nvJPEG in the main process; samples/s, CPU per sample, main process's share;
#   4. worker scaling (0, 1, 2, 4, 8, 14 workers) for captioning and text (bench_worker_scaling.py),
#      and captioning with 8 and 14 workers with the GPU hidden (no pinning in the main process).
# Each step has its own deadline and records every measurement in $OUT/gpu38.json as it is made;
# $OUT/gpu38.txt is the summary. DEVICE_DRY=1: tiny sizes on the CPU, CUDA parts skipped.
set -u
T0=$(date +%s)
PY=${PY:-python3}
OUT=${OUT:-/tmp/devout}
mkdir -p "$OUT"
JSON=$OUT/gpu38.json
WORK=${GPU38_WORK:-/tmp/gpu38}
BENCH=tools/benchmarks
rm -rf "$WORK" "$JSON"
mkdir -p "$WORK"
ts() { echo "[$(date -u +%T) +$(( $(date +%s) - T0 ))s] $*"; }
at() { echo $(( T0 + $1 )); }  # the wall-clock second $1 s after the start

if [ -n "${DEVICE_DRY:-}" ]; then
    CAP_SAMPLES=160; CAP_SHARDS=2; TEXT_SAMPLES=2000; TEXT_SHARDS=2; CAP_PROCS=1; TEXT_PROCS=1
    PIXELS=8; DEC_WORKERS=1; SCALE_WORKERS=2; DEC_S=0.5; DEC_WARM=0.3; SCALE_S=0.5; SCALE_WARM=0.3
    HIDDEN_WORKERS=2; T_PIXELS=40; T_DECODE=80; T_CAPTION=110; T_TEXT=140; T_HIDDEN=170
else
    CAP_SAMPLES=8000; CAP_SHARDS=16; TEXT_SAMPLES=120000; TEXT_SHARDS=16; CAP_PROCS=12; TEXT_PROCS=4
    PIXELS=64; DEC_WORKERS=0,2,14; SCALE_WORKERS=0,1,2,4,8,14; DEC_S=3; DEC_WARM=1.5
    SCALE_S=2.5; SCALE_WARM=1.0
    # deadlines (s after the start) by which each step stops starting runs
    HIDDEN_WORKERS=8,14
    T_PIXELS=60; T_DECODE=130; T_CAPTION=178; T_TEXT=218; T_HIDDEN=236
fi

summary() {
    $PY - "$JSON" > "$OUT/gpu38.txt" 2>&1 <<'EOF'
import json, sys
try:
    data = json.load(open(sys.argv[1]))
except Exception as exc:
    sys.exit(f"no results: {exc}")
print(json.dumps(data.get("machine", {})))
for key, value in data.get("gpu_decode_pixels", {}).items():
    print("pixels", key, json.dumps(value))
cols = ("samples_per_s", "cpu_ms_per_sample", "main_cpu_ms_per_sample", "main_cpu_share",
        "main_cores_busy", "workers_cores_busy", "vs_linear", "gpu_peak_mib", "cpu_fallbacks")
print("raw", json.dumps(data.get("gpu_decode_raw")))
print("cuda_checks", json.dumps(data.get("cuda_checks")))
sections = ("gpu_decode_throughput", "scaling_captioning", "scaling_text",
            "scaling_captioning_gpu_hidden")
for section in sections:
    print(f"\n{section}")
    for row in data.get(section, []):
        name = f"{row.get('mode', row.get('kind'))} w={row['workers']}"
        if "error" in row:
            print(f"  {name}: {row['error']}")
        else:
            print(f"  {name}: " + " ".join(f"{c}={row[c]}" for c in cols if c in row))
for key in ("steps", "errors"):
    print(key, json.dumps(data.get(key)))
EOF
    ts "summary written: $OUT/gpu38.txt"
}
trap 'ts "stopped by a signal"; summary; exit 143' TERM INT

step() {  # step NAME COMMAND...: run it, log its time and exit status into the JSON
    local name=$1; shift
    local started=$(date +%s)
    ts "== $name"
    "$@"
    local rc=$?
    ts "== $name rc=$rc ($(( $(date +%s) - started )) s)"
    STEPS="${STEPS:-}${STEPS:+,}\"$name\": {\"rc\": $rc, \"seconds\": $(( $(date +%s) - started ))}"
    $PY -c "import sys; sys.path.insert(0, '$BENCH'); import json, bench_timed as b; \
b.record('$JSON', 'steps', json.loads(sys.argv[1]))" "{${STEPS}}" || true
}

ts "gpu38 start; dry=${DEVICE_DRY:-0}; nproc=$(nproc); load $(cut -d' ' -f1-3 /proc/loadavg)"
$PY - "$JSON" <<'EOF' || ts "machine info failed"
import json, os, subprocess, sys
sys.path.insert(0, "tools/benchmarks")
import bench_timed
info = {"cores": os.cpu_count(), "load": os.getloadavg()}
try:
    shm = os.statvfs("/dev/shm")
    info["dev_shm_free_mib"] = shm.f_bavail * shm.f_frsize >> 20
except OSError as exc:
    info["dev_shm"] = repr(exc)
try:
    import torch
    info |= {"torch": torch.__version__, "cuda": torch.cuda.is_available()}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
except Exception as exc:
    info["torch_error"] = repr(exc)
for module in ("torchvision", "simplejpeg", "PIL", "numpy"):
    try:
        info[module] = __import__(module).__version__
    except Exception as exc:
        info[module] = f"missing: {exc!r}"
commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
info["commit"] = commit.stdout.strip() or "unknown (no git)"
bench_timed.record(sys.argv[1], "machine", info)
print(json.dumps(info))
EOF

# 1. data: both generators at once (captioning on most cores: JPEG encoding is the slow part)
ts "== data: captioning $CAP_SAMPLES x $CAP_PROCS procs, text $TEXT_SAMPLES x $TEXT_PROCS procs"
$PY $BENCH/bench_timed.py --make captioning "$WORK/captioning" --samples $CAP_SAMPLES \
    --shards $CAP_SHARDS --processes $CAP_PROCS > "$WORK/make-captioning.log" 2>&1 &
CAP_PID=$!
$PY $BENCH/bench_timed.py --make text "$WORK/text" --samples $TEXT_SAMPLES \
    --shards $TEXT_SHARDS --processes $TEXT_PROCS > "$WORK/make-text.log" 2>&1 &
TEXT_PID=$!
wait $CAP_PID; CAP_RC=$?
cat "$WORK/make-captioning.log" | tail -n 3
ts "captioning data rc=$CAP_RC"

# 2. pixels, while the text data is still being made
if [ $CAP_RC -eq 0 ]; then
    LEFT=$(( T_PIXELS - ($(date +%s) - T0) )); [ $LEFT -lt 10 ] && LEFT=10
    step pixels timeout -k 3 $LEFT \
        $PY $BENCH/bench_gpu_decode.py --dataset "$WORK/captioning" --pixels $PIXELS --json "$JSON" \
        --seconds $DEC_S
fi
wait $TEXT_PID; TEXT_RC=$?
tail -n 3 "$WORK/make-text.log"
ts "text data rc=$TEXT_RC"

# 3. GPU decode against CPU decode, through the loader
if [ $CAP_RC -eq 0 ]; then
    step decode $PY $BENCH/bench_gpu_decode.py --dataset "$WORK/captioning" --workers $DEC_WORKERS \
        --modes cpu_uint8,device --seconds $DEC_S --warm $DEC_WARM --json "$JSON" \
        --deadline $(at $T_DECODE)
    # 4. worker scaling
    step scaling_captioning $PY $BENCH/bench_worker_scaling.py \
        --dataset captioning="$WORK/captioning" --workers $SCALE_WORKERS --seconds $SCALE_S \
        --warm $SCALE_WARM --json "$JSON" --deadline $(at $T_CAPTION)
fi
if [ $TEXT_RC -eq 0 ]; then
    step scaling_text $PY $BENCH/bench_worker_scaling.py --dataset text="$WORK/text" \
        --workers $SCALE_WORKERS --seconds $SCALE_S --warm $SCALE_WARM --json "$JSON" \
        --deadline $(at $T_TEXT)
fi
if [ $CAP_RC -eq 0 ]; then  # what pinning float batches in the main process costs
    step scaling_captioning_gpu_hidden $PY $BENCH/bench_worker_scaling.py --hide-gpu \
        --dataset captioning="$WORK/captioning" --workers $HIDDEN_WORKERS --seconds $SCALE_S \
        --warm $SCALE_WARM --json "$JSON" --deadline $(at $T_HIDDEN)
fi
summary
cat "$OUT/gpu38.txt"
ts "gpu38 end"
