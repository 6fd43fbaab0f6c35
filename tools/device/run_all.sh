#!/usr/bin/env bash
# One run on a lent GPU machine (16 cores, no network): installs the carried wheels, then runs each
# check under its own time limit, writing what it measured under $OUT. Dry-run here on CPU with
#   DEVICE_DRY=1 OUT=/tmp/devout bash tools/device/run_all.sh
# (tiny sizes, no wheels needed). Each check is tools/device/<name>.sh, called with $OUT and
# $DEVICE_DRY set; it writes at most two files, $OUT/<name>.*, and prints a summary.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/devout}
mkdir -p "$OUT"
if [ -z "${DEVICE_DRY:-}" ] && [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site:$PWD
else
    export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
fi
PY=${PY:-python3}
export PY OUT
{ date -u; nproc; $PY -c 'import torch, sys; print(sys.version.split()[0], torch.__version__, torch.cuda.is_available())'
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null; } 2>&1 | tee "$OUT/machine.txt"
# name:seconds, in the order they run
CHECKS=${CHECKS:-"gpu38:250 prep35:200"}
for item in $CHECKS; do
    name=${item%%:*}; limit=${item##*:}
    [ -f "tools/device/$name.sh" ] || { echo "== $name: no script"; continue; }
    echo "== $name (limit ${limit}s) $(date -u +%T)"
    timeout -k 5 "$limit" bash "tools/device/$name.sh" 2>&1 | tail -c 20000 > "$OUT/$name.log"
    echo "== $name rc=${PIPESTATUS[0]} $(date -u +%T)"
    tail -n 40 "$OUT/$name.log"
done
