"""``prepare`` at scale: ``python tools/benchmarks/bench_prepare_scale.py``.

Tiny samples (one 8-byte ``.txt`` member each, 10,000 per shard) at 1M, 10M and 100M samples,
prepared with 1 and 2 worker processes, with the per-sample tables (``index.sqlite``) and
without (``--no-sample-tables``). Each run is a fresh process (imports not timed); this script
samples its process tree's memory (RSS of the main process; PSS of main + workers, the fair sum
of forked workers) every 0.5 s, and the run reports its wall time, the CPU time of all its
processes, the high-water RSS of the main process and of the largest worker (getrusage, which
no sampling interval can miss), the size of ``index.sqlite`` and the peak disk use (how far the
disk's free space went down: other writers on a shared disk count too). ``samples per
CPU-second`` is samples / that CPU time: what one core does.

How the data is made: shards are written by a numpy template (one header layout, the shard
number and checksum patched in). Up to ``--max-real`` samples every shard is a real file; above
it, the shards are hard links to the shards of the largest real set, and (because their members
are then the same) the keys are made unique while scanning by prefixing each key with its
shard's name (a patch of ``energon.prepare.scan._scan_local`` in the measured process,
inherited by its forked workers): the tar walk, the grouping, the sqlite writing and merging
all run on real bytes and rows. ``--no-sample-tables`` needs no such patch (it does not compare
keys across shards).

``--keys hashed`` writes real shards whose keys are in no order (12 hex digits of
``n * odd mod 2**48``: unique, and unordered as hashed file names are), and ``--key-index
kept,auto`` measures prepare against the baseline of keeping ``index.sqlite``'s key index up as
rows come in whatever the key order (a patch of the writer in the measured process).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_common import _REPO_ROOT, machine_summary, print_markdown_table, sample_memory  # noqa: E402

PER_SHARD = 10_000


def write_shards(folder: str, first: int, count: int, per_shard: int, hashed: bool = False) -> None:
    """Shards ``first ... first + count - 1`` of tiny samples (skips those already there).
    ``hashed``: keys in no order (12 hex digits of a bijection of the sample number, unique)."""
    os.makedirs(folder, exist_ok=True)
    records = np.zeros((per_shard, 1024), dtype=np.uint8)

    def put(column: int, rows: list[bytes]) -> None:
        array = np.frombuffer(b"".join(rows), dtype=np.uint8).reshape(per_shard, -1)
        records[:, column : column + array.shape[1]] = array

    put(0, [b"000000_%07d.txt" % i for i in range(per_shard)])
    for column, value in ((100, b"0000644\0"), (108, b"0000000\0"), (116, b"0000000\0")):
        put(column, [value] * per_shard)
    put(124, [b"%011o\0" % 8] * per_shard)
    put(136, [b"00000000000\0"] * per_shard)
    put(156, [b"0"] * per_shard)
    put(257, [b"ustar\0"] * per_shard)
    put(263, [b"00"] * per_shard)
    put(148, [b"        "] * per_shard)
    put(512, [b"%08d" % i for i in range(per_shard)])
    base = records[:, :512].astype(np.int64).sum(axis=1) - 6 * ord("0")
    if hashed:
        records[:, 0:100] = 0  # the name field, without the numbered name
        put(0, [b"%012x.txt" % 0] * per_shard)
        base = records[:, :512].astype(np.int64).sum(axis=1) - 12 * ord("0")
    for shard in range(first, first + count):
        path = os.path.join(folder, f"shard-{shard:06d}.tar")
        if os.path.exists(path):
            continue
        if hashed:
            name = _hashed_names(shard * per_shard, per_shard)
            records[:, 0:12] = name
            total = base + name.astype(np.int64).sum(axis=1)
        else:
            digits = np.frombuffer(b"%06d" % shard, dtype=np.uint8)
            records[:, 0:6] = digits
            total = base + int(digits.astype(np.int64).sum())
        for k in range(6):
            records[:, 148 + k] = ord("0") + ((total >> (3 * (5 - k))) & 7)
        records[:, 154], records[:, 155] = 0, ord(" ")
        with open(path + ".tmp", "wb") as f:
            f.write(records.tobytes())
            f.write(bytes(1024))
        os.replace(path + ".tmp", path)


def _hashed_names(first: int, count: int) -> np.ndarray:
    """12 lower-case hex digits per sample: ``n * odd mod 2**48`` (a bijection, so unique)."""
    n = np.arange(first, first + count, dtype=np.uint64)
    value = (n * np.uint64(0x9E3779B97F4B)) & np.uint64((1 << 48) - 1)
    nibbles = (value[:, None] >> (np.arange(44, -4, -4, dtype=np.uint64))) & np.uint64(15)
    return np.frombuffer(b"0123456789abcdef", dtype=np.uint8)[nibbles.astype(np.int64)]


def make_hashed_set(root: str, samples: int) -> str:
    """A set of ``samples`` tiny samples with keys in no order (real shards only)."""
    folder = os.path.join(root, f"tiny-{samples}-hashed")
    write_shards(os.path.join(folder, "parts"), 0, samples // PER_SHARD, PER_SHARD, hashed=True)
    return folder


def make_set(root: str, samples: int, max_real: int) -> tuple[str, bool]:
    """The folder of a set of ``samples`` tiny samples, and whether its shards are links."""
    shards = samples // PER_SHARD
    folder = os.path.join(root, f"tiny-{samples}")
    real_shards = max_real // PER_SHARD
    real_parts = os.path.join(root, f"tiny-{max_real}", "parts")
    linked = shards > real_shards
    if not linked:
        write_shards(os.path.join(folder, "parts"), 0, shards, PER_SHARD)
        return folder, False
    write_shards(real_parts, 0, real_shards, PER_SHARD)
    parts = os.path.join(folder, "parts")
    os.makedirs(parts, exist_ok=True)
    for shard in range(shards):
        link = os.path.join(parts, f"shard-{shard:06d}.tar")
        if not os.path.exists(link):
            os.link(os.path.join(real_parts, f"shard-{shard % real_shards:06d}.tar"), link)
    return folder, True


CHILD = textwrap.dedent(
    """
    import json, os, resource, sys, time
    root, workers, tables, unique_keys = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", sys.argv[4] == "1"
    key_index = sys.argv[5]
    from energon.prepare import scan as prepare_scan
    from energon.prepare.dataset import prepare_dataset

    if key_index == "kept":  # the baseline: the UNIQUE key index kept up whatever the key order
        from energon.format.sqlite_index import SqliteIndexWriter
        SqliteIndexWriter._chunk_keys_ascend = lambda self: True

    if unique_keys:  # shards that are links to the same file: keys made unique by shard name
        real_scan = prepare_scan._scan_local

        def scan(local, shown):
            result = real_scan(local, shown)
            prefix = os.path.basename(shown).split(".")[0] + "/"
            result.keys = [prefix + k for k in result.keys]
            return result

        prepare_scan._scan_local = scan
    t0, c0 = time.perf_counter(), os.times()
    r = prepare_dataset(root, progress=False, num_workers=workers, sample_tables=tables)
    t1, c1 = time.perf_counter(), os.times()
    cpu = sum(getattr(c1, f) - getattr(c0, f)
              for f in ("user", "system", "children_user", "children_system"))
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    workers_max = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # largest worker
    index = os.path.join(root, ".nv-meta", "index.sqlite")
    size = os.path.getsize(index) if os.path.exists(index) else 0
    print(json.dumps({"samples": r.total_samples, "wall": t1 - t0, "cpu": cpu, "maxrss_main": own,
                      "maxrss_worker": workers_max, "index_bytes": size}))
    """
)


def clear_outputs(folder: str) -> None:
    shutil.rmtree(os.path.join(folder, ".nv-meta"), ignore_errors=True)
    parts = os.path.join(folder, "parts")
    for name in os.listdir(parts):
        if name.endswith(".idx"):
            os.unlink(os.path.join(parts, name))


def measure(folder: str, workers: int, tables: bool, linked: bool, key_index: str = "auto") -> dict:
    clear_outputs(folder)
    env = {**os.environ, "PYTHONPATH": _REPO_ROOT}
    args = [folder, str(workers), "1" if tables else "0", "1" if linked and tables else "0"]
    args.append(key_index)
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    peak_rss = peak_pss = 0
    last_pss = 0.0
    free_before = min_free = _free_bytes(folder)
    while proc.poll() is None:
        now = time.monotonic()
        min_free = min(min_free, _free_bytes(folder))
        try:
            snap = sample_memory(proc.pid, with_pss=now - last_pss >= 2.0)
        except (FileNotFoundError, ProcessLookupError, IndexError):
            break
        peak_rss = max(peak_rss, snap.rss_main)
        if snap.pss_total is not None:
            peak_pss, last_pss = max(peak_pss, snap.pss_total), now
        time.sleep(0.5)
    out, err = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"prepare failed:\n{err[-3000:]}")
    result = json.loads(out.strip().splitlines()[-1])
    result.update(peak_rss_main=peak_rss, peak_pss_total=peak_pss, load=os.getloadavg()[0])
    result["peak_disk"] = free_before - min_free  # also counts other writers on a shared disk
    return result


def _free_bytes(folder: str) -> int:
    st = os.statvfs(folder)
    return st.f_bavail * st.f_frsize


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default="/tmp/bench_prepare_scale")
    parser.add_argument("--samples", default="1000000,10000000,100000000")
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--tables", default="1,0", help="1: with sample tables, 0: without")
    parser.add_argument("--max-real", type=int, default=10_000_000, help="samples on real shards")
    parser.add_argument(
        "--keys",
        choices=("numbered", "hashed"),
        default="numbered",
        help="hashed: keys in no order (real shards only), as hashed file names are",
    )
    parser.add_argument(
        "--key-index",
        default="auto",
        help="auto: as prepare decides; kept: the UNIQUE key index kept up whatever the key "
        "order (the baseline); a comma-separated list runs each",
    )
    args = parser.parse_args()
    rows = []
    print(machine_summary(), flush=True)
    for samples in [int(s) for s in args.samples.split(",")]:
        if args.keys == "hashed":
            if samples > args.max_real:
                parser.error("--keys hashed needs real shards: --samples at most --max-real")
            folder, linked = make_hashed_set(args.root, samples), False
        else:
            folder, linked = make_set(args.root, samples, args.max_real)
        for tables in [t == "1" for t in args.tables.split(",")]:
            for workers in [int(w) for w in args.workers.split(",")]:
                for key_index in args.key_index.split(",") if tables else ["auto"]:
                    r = measure(folder, workers, tables, linked, key_index)
                    at_end = tables and args.keys == "hashed" and key_index == "auto"
                    rows.append(
                        [
                            f"{samples:,}",
                            "links" if linked else "real",
                            args.keys,
                            workers,
                            "yes" if tables else "no",
                            ("built at end" if at_end else "kept up") if tables else "",
                            f"{r['wall']:.1f}",
                            f"{r['cpu']:.1f}",
                            f"{samples / r['cpu']:,.0f}",
                            f"{r['maxrss_main'] / 2**20:.0f}",
                            f"{r['maxrss_worker'] / 2**20:.0f}" if workers > 1 else "",
                            f"{r['peak_pss_total'] / 2**20:.0f}",
                            f"{r['index_bytes'] / 2**20:,.0f}",
                            f"{r['peak_disk'] / 2**20:,.0f}",
                            f"{r['load']:.1f}",
                        ]
                    )
                    print(" | ".join(map(str, rows[-1])), flush=True)
        clear_outputs(folder)
    print(machine_summary())
    print_markdown_table(
        [
            "samples",
            "shards",
            "keys",
            "workers",
            "sample tables",
            "key index",
            "wall s",
            "CPU s",
            "samples per CPU-second",
            "peak RSS main MiB",
            "peak RSS worker MiB",
            "peak PSS all MiB",
            "index.sqlite MiB",
            "peak disk MiB",
            "load at end",
        ],
        rows,
    )


if __name__ == "__main__":
    main()
