#!/usr/bin/env bash
# prep35 (issue 35, "prepare at a billion samples"): `energon prepare` on tiny samples with
# 1, 2, 4, 8 and 14 worker processes, with and without the per-sample tables (index.sqlite),
# then one large prepare (up to 100M samples, --no-sample-tables) on hard-linked shards.
#
# Run from the repository root by tools/device/run_all.sh ($PY, $OUT, $DEVICE_DRY, $PYTHONPATH set).
# Everything must fit 190 s of wall time (killed at 200 s): the driver below plans against that
# budget, prints a timestamp per step, skips a step that would not fit, and rewrites
# $OUT/prep35.json and $OUT/prep35.txt after every run, so whatever finished is kept.
#
# The data: shards of 8-byte text samples written by a numpy template
# (tools/benchmarks/bench_prepare_scale.py: write_shards) into /tmp/prep35-dev; the large set is
# made of hard links to the real shards (its bytes are real, read from the page cache; without
# sample tables no key is compared across shards, so repeated keys do not matter).
# Each prepare is a fresh Python process (prepare_dataset, imports not timed); CPU time is that
# process's and its workers' (user + system); peak RSS is the main process's and the largest
# worker's (getrusage).
# Here on CPU: DEVICE_DRY=1 OUT=/tmp/devout CHECKS=prep35:200 bash tools/device/run_all.sh
set -u
PY=${PY:-python3}
OUT=${OUT:-/tmp/devout}
mkdir -p "$OUT"
export OUT DEVICE_DRY=${DEVICE_DRY:-}
export ENERGON_CACHE_DIR=/tmp/prep35-dev/cache  # the compiled tar walk, wherever HOME is
exec "$PY" - <<'PYEOF'
import json, os, platform, shutil, subprocess, sys, textwrap, time

T0 = time.monotonic()
DRY = bool(os.environ.get("DEVICE_DRY"))
OUT = os.environ["OUT"]
BUDGET = 40.0 if DRY else 186.0  # seconds of wall for everything, data included
ROOT = "/tmp/prep35-dev"
PER_SHARD = 1_000 if DRY else 10_000
SCALE_SAMPLES = 20_000 if DRY else 2_000_000  # the scaling runs: all real shards
BIG_SAMPLES = 200_000 if DRY else 100_000_000  # the large run: hard links to those shards
PROCS = [1, 2, 4] if DRY else [1, 2, 4, 8, 14]
sys.path.insert(0, os.path.join(os.getcwd(), "tools", "benchmarks"))

result = {
    "budget_s": BUDGET,
    "dry": DRY,
    "per_shard": PER_SHARD,
    "runs": [],
    "skipped": [],
    "log": [],
}


def now() -> float:
    return time.monotonic() - T0


def log(message: str) -> None:
    line = f"[{time.strftime('%H:%M:%S', time.gmtime())} +{now():6.1f}s] {message}"
    print(line, flush=True)
    result["log"].append(line)


def machine() -> dict:
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next((x.split(":", 1)[1].strip() for x in f if x.startswith("model name")), "")
    except OSError:
        pass
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    disk = shutil.disk_usage("/tmp")
    return {
        "cpus": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)),
        "cpu_model": model,
        "python": platform.python_version(),
        "commit": commit or "unknown",
        "tmp_free_gib": round(disk.free / 2**30, 1),
        "load_at_start": os.getloadavg(),
    }


def table() -> str:
    head = (
        "samples",
        "data",
        "procs",
        "tables",
        "wall s",
        "merge s",
        "CPU s",
        "samples/s",
        "samples/CPU-s",
        "speed-up",
        "per core",
        "RSS main MiB",
        "RSS worker MiB",
        "load",
    )
    rows = [head]
    for r in result["runs"]:
        rows.append(
            (
                f"{r['samples']:,}",
                r["data"],
                r["procs"],
                "yes" if r["tables"] else "no",
                f"{r['wall_s']:.2f}",
                f"{r['sqlite_merge_wall_s']:.2f}",
                f"{r['cpu_s']:.2f}",
                f"{r['samples_per_s']:,.0f}",
                f"{r['samples_per_cpu_s']:,.0f}",
                f"{r['speedup']:.2f}" if "speedup" in r else "-",
                f"{r['efficiency']:.2f}" if "efficiency" in r else "-",
                f"{r['peak_rss_main_mib']:.0f}",
                f"{r['peak_rss_worker_mib']:.0f}",
                f"{r['load1']:.1f}",
            )
        )
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(head))]
    lines = [" | ".join(str(v).rjust(w) for v, w in zip(row, widths)) for row in rows]
    return "\n".join([lines[0], "-" * len(lines[0]), *lines[1:]])


def save() -> None:
    result["elapsed_s"] = round(now(), 1)
    for name, text in (
        ("prep35.json", json.dumps(result, indent=1)),
        ("prep35.txt", table() + "\n\n" + "\n".join(result["log"]) + "\n"),
    ):
        tmp = os.path.join(OUT, name + ".tmp")
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, os.path.join(OUT, name))


CHILD = textwrap.dedent("""
    import json, os, resource, sys, time
    root, workers, tables = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
    from energon.prepare.dataset import prepare_dataset

    merge = [0.0]  # wall time of the part of a prepare that runs in one process: index.sqlite


    def timed(cls, name):
        real = getattr(cls, name)

        def run(*args, **kwargs):
            t = time.perf_counter()
            try:
                return real(*args, **kwargs)
            finally:
                merge[0] += time.perf_counter() - t

        setattr(cls, name, run)


    try:  # since the merge runs while the workers scan
        from energon.prepare.merge import IndexMerge

        timed(IndexMerge, "chunk_finished")
        timed(IndexMerge, "close")
    except ImportError:  # before: all of it after the scan
        from energon.prepare import dataset

        timed(dataset, "_build_sqlite")
    t0, c0 = time.perf_counter(), os.times()
    r = prepare_dataset(root, progress=False, num_workers=workers, sample_tables=tables)
    t1, c1 = time.perf_counter(), os.times()
    cpu = sum(getattr(c1, f) - getattr(c0, f)
              for f in ("user", "system", "children_user", "children_system"))
    print(json.dumps({"samples": r.total_samples, "wall": t1 - t0, "cpu": cpu, "merge": merge[0],
                      "rss_main_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                      "rss_worker_kib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))
""")


def clear_outputs(folder: str) -> None:
    shutil.rmtree(os.path.join(folder, ".nv-meta"), ignore_errors=True)
    parts = os.path.join(folder, "parts")
    for name in os.listdir(parts):
        if name.endswith(".idx"):
            os.unlink(os.path.join(parts, name))


def prepare(folder: str, samples: int, data: str, procs: int, tables: bool, limit: float):
    """One prepare in a fresh process; its row in the results, or None (failed, too slow)."""
    clear_outputs(folder)
    log(f"prepare {samples:,} samples ({data}), {procs} procs, tables={tables}, limit {limit:.0f}s")
    try:
        done = subprocess.run(
            [sys.executable, "-c", CHILD, folder, str(procs), str(int(tables))],
            capture_output=True,
            text=True,
            timeout=max(1.0, limit),
        )
    except subprocess.TimeoutExpired:
        result["skipped"].append(
            f"{samples} samples, {procs} procs, tables={tables}: stopped after {limit:.0f}s"
        )
        log("  stopped: over its time limit")
        return None
    if done.returncode != 0:
        result["skipped"].append(f"{samples}/{procs}/{tables}: failed: {done.stderr[-1500:]}")
        log(f"  FAILED: {done.stderr[-1500:]}")
        return None
    r = json.loads(done.stdout.strip().splitlines()[-1])
    assert r["samples"] == samples, (r["samples"], samples)
    row = {
        "samples": samples,
        "data": data,
        "procs": procs,
        "tables": tables,
        "wall_s": r["wall"],
        "cpu_s": r["cpu"],
        "sqlite_merge_wall_s": r["merge"],
        "samples_per_s": samples / r["wall"],
        "samples_per_cpu_s": samples / r["cpu"],
        "cpu_us_per_sample": 1e6 * r["cpu"] / samples,
        "peak_rss_main_mib": r["rss_main_kib"] / 1024,
        "peak_rss_worker_mib": r["rss_worker_kib"] / 1024,
        "load1": os.getloadavg()[0],
        "at_s": round(now(), 1),
    }
    result["runs"].append(row)
    log(
        f"  wall {r['wall']:.2f}s (index.sqlite merge {r['merge']:.2f}s), CPU {r['cpu']:.2f}s, "
        f"{row['samples_per_s']:,.0f} samples/s, "
        f"{row['samples_per_cpu_s']:,.0f} per CPU-s, RSS main {row['peak_rss_main_mib']:.0f} MiB"
    )
    return row


def make_real(samples: int) -> str:
    from bench_prepare_scale import write_shards

    folder = os.path.join(ROOT, f"real-{samples}")
    write_shards(os.path.join(folder, "parts"), 0, samples // PER_SHARD, PER_SHARD)
    return folder


def make_links(samples: int, real: str) -> str:
    folder = os.path.join(ROOT, f"links-{samples}")
    parts = os.path.join(folder, "parts")
    os.makedirs(parts, exist_ok=True)
    real_shards = sorted(n for n in os.listdir(os.path.join(real, "parts")) if n.endswith(".tar"))
    for shard in range(samples // PER_SHARD):
        os.link(
            os.path.join(real, "parts", real_shards[shard % len(real_shards)]),
            os.path.join(parts, f"shard-{shard:07d}.tar"),
        )
    return folder


def scaling(folder: str, tables: bool, reserve: float) -> None:
    """The process counts in turn; a count whose predicted time (from the runs before) does not
    fit the budget left (less ``reserve`` for later steps) is skipped."""
    base = None
    for procs in PROCS:
        left = BUDGET - now() - reserve
        if base is not None:
            predicted = base["wall_s"] / min(procs, 0.6 * procs + 0.4) + 1.0
            if predicted > left:
                result["skipped"].append(
                    f"scaling tables={tables} procs={procs}: predicted "
                    f"{predicted:.0f}s, {left:.0f}s left"
                )
                log(
                    f"skip {procs} procs (tables={tables}): "
                    f"predicted {predicted:.0f}s > {left:.0f}s"
                )
                continue
        row = prepare(folder, SCALE_SAMPLES, "real", procs, tables, left)
        if row is None:
            continue
        if base is None:
            base = row
        row["speedup"] = row["samples_per_s"] / base["samples_per_s"]
        row["efficiency"] = row["speedup"] / (procs / base["procs"])
        save()


def big_run(real: str, rate14: float | None) -> None:
    """The largest multiple of 10M samples (100M at most) that the time left allows."""
    left = BUDGET - now() - 3.0
    samples = BIG_SAMPLES
    if rate14 and not DRY:
        fits = int(0.75 * left * rate14 // 10_000_000) * 10_000_000
        samples = min(BIG_SAMPLES, fits)
        log(f"large run: {left:.0f}s left at {rate14:,.0f} samples/s -> {samples:,} samples")
    if samples <= 0:
        result["skipped"].append(f"large run: {left:.0f}s left")
        return
    folder = make_links(samples, real)
    log(f"{samples // PER_SHARD:,} hard links made")
    row = prepare(folder, samples, "hard links", PROCS[-1], False, BUDGET - now() - 1.0)
    if row is not None:
        result["large"] = row
    save()


def main() -> None:
    shutil.rmtree(ROOT, ignore_errors=True)
    os.makedirs(ROOT)
    result["machine"] = machine()
    from energon.format import tar_native

    result["machine"]["native_tar_walk"] = tar_native.available()  # compiles it once, untimed
    log(f"machine {result['machine']}")
    save()
    real = make_real(SCALE_SAMPLES)
    log(f"{SCALE_SAMPLES:,} samples written ({SCALE_SAMPLES // PER_SHARD} shards)")
    os.sync()  # the first timed run must not pay for writing the data back
    log("synced")
    scaling(real, tables=False, reserve=0.55 * (BUDGET - now()))
    fastest = max(
        (r for r in result["runs"] if not r["tables"]),
        key=lambda r: r["samples_per_s"],
        default=None,
    )
    scaling(real, tables=True, reserve=0.2 * (BUDGET - now()))
    big_run(real, fastest["samples_per_s"] if fastest else None)
    log("done")
    save()
    print(table())


try:
    main()
finally:
    save()
    shutil.rmtree(ROOT, ignore_errors=True)
PYEOF
