"""Start-up of one rank of many: ``python tools/benchmarks/bench_scale.py``.

Rank 4095 of 4096 (0 and 2 workers) builds a training dataset and takes its first batch, in a
fresh process (``import torch`` and ``import energon`` timed apart, not counted), for datasets of
10k, 100k and 1M shards of 10 tiny text samples each, and for a metadataset that blends 100
datasets. Reported: seconds after import (build, first batch), and the bytes the rank's
processes read in that time (``rchar`` of ``/proc/<pid>/io``: the main process from before the
build, plus its workers), next to the rank's own index bytes (the ``.tar.idx`` of the shards
its streams read).

The datasets are synthetic where the rank never looks: ``.info.json``, the split config and the
shard table list every shard, but only the shards of this rank's streams (and two on either
side) exist as tar files with their ``.tar.idx``. The reference (Megatron-Energon 7.4.1, its
venv in ``.cache/ref-venv``) runs the same script as a black box on the same folders, where it
finishes in ``--reference-timeout`` seconds. ``--no-table`` also runs energon with the shard
table hidden (the fallback that reads ``.info.json``).

A second table gives what the same rank would ask object storage for, as ``energon simulate``
counts it (a test checks that count against a real rank's requests to an S3 API server on
loopback): the part every rank reads, its own ``.tar.idx`` and its own part of the shard table.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import os
import subprocess
import sys
import tarfile
import textwrap
import uuid

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_common import _REPO_ROOT, machine_summary, print_markdown_table  # noqa: E402

from energon.format.info import info_json_text  # noqa: E402
from energon.format.layout import SHARD_TABLE_FILENAME  # noqa: E402
from energon.format.shard_table import FORMAT_VERSION as TABLE_FORMAT  # noqa: E402
from energon.format.shard_table import read_table_header  # noqa: E402
from energon.format.split import split_config_text  # noqa: E402
from energon.format.split_shards import write_shard_table  # noqa: E402
from energon.format.tar import scan_tar  # noqa: E402
from energon.format.tar_index import tar_index_path, write_tar_index  # noqa: E402
from energon.plan.sharding import stream_range  # noqa: E402
from energon.source.startup_reads import LeafReads  # noqa: E402
from energon.source.webdataset import WebdatasetLeaf  # noqa: E402

SAMPLES_PER_SHARD = 10
RANK, WORLD = 4095, 4096
REF_PYTHON = os.path.join(_REPO_ROOT, ".cache", "ref-venv", "bin", "python")
TEXT_YAML = (
    "sample_type:\n  __module__: megatron.energon\n  __class__: TextSample\n"
    "field_map:\n  text: txt\n"
)

# ----------------------------------------------------------------------------------------------
# Synthetic datasets


def shard_name(i: int) -> str:
    return f"parts/data-{i:07d}.tar"


def rank_streams(workers: int, layout: str = "energon") -> list[int]:
    """The logical streams rank RANK reads: energon's micro-batch ``m`` is stream ``m % L`` and
    rank ``r`` takes ``r, r + W, ...``; the reference's worker ``w`` of rank ``r`` is global
    worker ``r * workers + w``."""
    per_rank = max(1, workers)
    if layout == "energon":
        return [RANK + k * WORLD for k in range(per_rank)]
    return [RANK * per_rank + w for w in range(per_rank)]


def own_shards(
    num_shards: int, workers_options: list[int], margin: int = 2, layouts=("energon", "reference")
) -> set[int]:
    """Shards that rank RANK reads with any of the worker counts (its streams' ranges, in either
    tool's layout), plus ``margin`` on either side."""
    total = num_shards * SAMPLES_PER_SHARD
    wanted: set[int] = set()
    for workers in workers_options:
        streams = WORLD * max(1, workers)
        for stream in {s for layout in layouts for s in rank_streams(workers, layout)}:
            first, end = stream_range(0, total, streams, 0, stream)
            a, b = first // SAMPLES_PER_SHARD, -(-end // SAMPLES_PER_SHARD)
            wanted.update(range(max(0, a - margin), min(num_shards, b + margin)))
    return wanted


def write_real_shard(root: str, shard: int) -> int:
    """One tar of SAMPLES_PER_SHARD texts and its ``.tar.idx``; returns the index's size."""
    path = os.path.join(root, shard_name(shard))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for i in range(SAMPLES_PER_SHARD):
            data = f"text {i} of shard {shard}".encode()
            member = tarfile.TarInfo(f"{shard:07d}_{i:02d}.txt")
            member.size = len(data)
            tar.addfile(member, io.BytesIO(data))
    with open(path, "wb") as f:
        f.write(buf.getvalue())
    offsets = scan_tar(path).sample_offsets()
    write_tar_index(tar_index_path(path), offsets)
    return 8 * len(offsets)


def make_dataset(root: str, num_shards: int, real: set[int]) -> None:
    """The metadata of ``num_shards`` shards (all of them listed), the ``real`` ones on disk."""
    marker = os.path.join(root, ".bench_scale.json")
    wanted = {"shards": num_shards, "real": sorted(real), "format": 1}
    if os.path.exists(marker) and json.load(open(marker)) == wanted:
        keep_table_current(root)
        return
    meta = os.path.join(root, ".nv-meta")
    os.makedirs(meta, exist_ok=True)
    for shard in sorted(real):
        write_real_shard(root, shard)
    counts = {shard_name(i): SAMPLES_PER_SHARD for i in range(num_shards)}
    names = list(counts)
    files = {
        "dataset.yaml": TEXT_YAML,
        "split.yaml": split_config_text({"train": names, "val": [], "test": []}),
        "index.uuid": str(uuid.uuid4()),
        ".info.json": info_json_text(counts, "bench"),
    }
    for name, text in files.items():
        with open(os.path.join(meta, name), "w") as f:
            f.write(text)
    write_shard_table(root, "split.yaml")
    with open(marker, "w") as f:
        json.dump(wanted, f)


def keep_table_current(root: str) -> None:
    """Write the shard table again where an earlier energon wrote it in an older format."""
    path = os.path.join(root, ".nv-meta", SHARD_TABLE_FILENAME)
    if read_table_header(path)[0]["format"] != TABLE_FORMAT:
        print(f"{root}: writing the shard table in format {TABLE_FORMAT}", flush=True)
        write_shard_table(root, "split.yaml")


def make_blend(root: str, datasets: int, shards_each: int, workers: list[int]) -> str:
    """``datasets`` datasets of ``shards_each`` shards, blended with equal weights."""
    entries = []
    for d in range(datasets):
        path = os.path.join(root, f"ds{d:03d}")
        make_dataset(path, shards_each, own_shards(shards_each, workers))
        entries.append(f"      - path: {path}\n        weight: 1.0\n")
    yaml_path = os.path.join(root, "blend.yaml")
    with open(yaml_path, "w") as f:
        f.write(
            "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n"
            "    blend:\n" + "".join(entries)
        )
    return yaml_path


def own_index_bytes(root: str, num_shards: int, workers: int) -> int:
    """The ``.tar.idx`` bytes of the shards this rank's streams read (without the margin)."""
    shards = own_shards(num_shards, [workers], margin=0, layouts=("energon",))
    return sum(os.path.getsize(tar_index_path(os.path.join(root, shard_name(s)))) for s in shards)


def object_storage_row(name: str, root: str, workers: int) -> list[object]:
    """What rank RANK asks object storage for (index and metadata, not samples), as ``energon
    simulate`` counts it (``tests/preflight/test_startup_reads.py`` checks that count against a
    real rank's GETs to the loopback S3 server, byte for byte): the part every rank reads, its
    shards' ``.tar.idx`` (fetched whole from object storage) and its part of the shard table."""
    leaf = WebdatasetLeaf.open(root, split_part="train")
    reads = LeafReads.of(leaf, np.asarray([*leaf.shard_starts, len(leaf)], dtype=np.int64))
    assert reads is not None
    streams = WORLD * max(1, workers)
    ranges = [stream_range(0, len(leaf), streams, 0, s) for s in rank_streams(workers)]
    own = reads.own_bytes(ranges)
    own_index = dataclasses.replace(reads, block_shards=0).own_bytes(ranges)
    total = reads.summary_bytes + own
    return [
        name,
        workers,
        f"{reads.summary_bytes:,}",
        f"{own_index:,}",
        f"{own - own_index:,}",
        f"{total:,}",
        f"{total - 2 * own_index:,}",
    ]


# ----------------------------------------------------------------------------------------------
# One measured start-up, in a fresh process

CHILD = textwrap.dedent(
    """
    import json, os, sys, time
    t0 = time.perf_counter()
    import torch
    t1 = time.perf_counter()
    tool, path, rank, world, workers = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6])
    if tool == "energon":
        from energon import WorkerConfig, get_loader, get_train_dataset
    else:
        from megatron.energon import WorkerConfig, get_loader, get_train_dataset
    t2 = time.perf_counter()

    def io_of(pid):
        fields = dict(l.split(": ") for l in open(f"/proc/{pid}/io").read().splitlines())
        return int(fields["rchar"]), int(fields["syscr"])

    before = io_of("self")
    t3 = time.perf_counter()
    wc = WorkerConfig(rank=rank, world_size=world, num_workers=workers)
    ds = get_train_dataset(path, worker_config=wc, batch_size=2, shuffle_buffer_size=None,
                           max_samples_per_sequence=100)
    t4 = time.perf_counter()
    batch = next(iter(get_loader(ds)))
    t5 = time.perf_counter()
    after = io_of("self")
    children = [int(p) for p in open(f"/proc/self/task/{os.getpid()}/children").read().split()]
    worker_io = [io_of(p) for p in children]
    print(json.dumps({
        "import_torch": t1 - t0, "import": t2 - t1, "build": t4 - t3, "first": t5 - t4,
        "rchar": after[0] - before[0] + sum(r for r, _ in worker_io),
        "syscr": after[1] - before[1] + sum(c for _, c in worker_io),
        "keys": list(batch.__key__ if hasattr(batch, "__key__") else batch["__key__"]),
    }))
    sys.stdout.flush()
    os._exit(0)
    """
)


def measure(tool: str, path: str, workers: int, timeout: float) -> dict | None:
    python = sys.executable if tool != "reference" else REF_PYTHON
    env = dict(os.environ)
    if tool != "reference":
        env["PYTHONPATH"] = _REPO_ROOT + os.pathsep + env.get("PYTHONPATH", "")
    args = [python, "-c", CHILD, "energon" if tool != "reference" else tool, path]
    try:
        done = subprocess.run(
            [*args, str(RANK), str(WORLD), str(workers)],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
        )
    except subprocess.TimeoutExpired:
        return {"timeout": timeout}
    if done.returncode != 0:
        print(f"{tool} {path} {workers} workers failed:\n{done.stderr[-3000:]}", file=sys.stderr)
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


def hidden_table(root: str):
    """Context: the shard table renamed away (energon's fallback path)."""
    import contextlib

    @contextlib.contextmanager
    def hide():
        table = os.path.join(root, ".nv-meta", SHARD_TABLE_FILENAME)
        os.replace(table, table + ".hidden")
        try:
            yield
        finally:
            os.replace(table + ".hidden", table)

    return hide()


# ----------------------------------------------------------------------------------------------
# The run


def row(name: str, tool: str, workers: int, result: dict | None, own: int) -> list[object]:
    if result is None:
        return [name, tool, workers, "failed", "", "", "", "", own]
    if "timeout" in result:
        return [name, tool, workers, f"> {result['timeout']:.0f}", "", "", "", "", own]
    after_import = result["build"] + result["first"]
    return [
        name,
        tool,
        workers,
        f"{after_import:.3f}",
        f"{result['build']:.3f}",
        f"{result['first']:.3f}",
        f"{result['rchar']:,}",
        f"{result['syscr']:,}",
        f"{own:,}",
    ]


def run_case(name, path, workers_list, tools, args, own_bytes, table_root=None) -> list[list]:
    rows = []
    for workers in workers_list:
        for tool in tools:
            timeout = args.reference_timeout if tool == "reference" else args.timeout
            if tool == "energon (no table)":
                with hidden_table(table_root):
                    result = measure(tool, path, workers, timeout)
            else:
                result = measure(tool, path, workers, timeout)
            rows.append(row(name, tool, workers, result, own_bytes(workers)))
            print(" | ".join(map(str, rows[-1])), f"(load {os.getloadavg()[0]:.1f})", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default="/tmp/bench_scale")
    parser.add_argument("--shards", default="10000,100000,1000000")
    parser.add_argument("--workers", default="0,2")
    parser.add_argument("--blend", type=int, default=100, help="datasets in the blend (0: none)")
    parser.add_argument("--blend-shards", type=int, default=10_000, help="shards of each")
    parser.add_argument("--reference", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--reference-timeout", type=float, default=300)
    parser.add_argument("--no-table", action="store_true", help="also run without the table")
    parser.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args()
    workers_list = [int(w) for w in args.workers.split(",")]
    tools = ["energon"] + (["energon (no table)"] if args.no_table else [])
    tools += ["reference"] if args.reference and os.path.exists(REF_PYTHON) else []
    print(machine_summary(), flush=True)
    rows, remote_rows = [], []
    for n in [int(s) for s in args.shards.split(",")]:
        root = os.path.join(args.root, f"shards-{n}")
        make_dataset(root, n, own_shards(n, workers_list))
        remote_rows += [
            object_storage_row(f"{n:,} shards, object storage", root, w) for w in workers_list
        ]
        rows += run_case(
            f"{n:,} shards",
            root,
            workers_list,
            tools,
            args,
            lambda w, root=root, n=n: own_index_bytes(root, n, w),
            root,
        )
    if args.blend:
        blend = make_blend(
            os.path.join(args.root, f"blend-{args.blend}x{args.blend_shards}"),
            args.blend,
            args.blend_shards,
            workers_list,
        )
        folder = os.path.dirname(blend)
        rows += run_case(
            f"blend of {args.blend} x {args.blend_shards:,} shards",
            blend,
            workers_list,
            [t for t in tools if t != "energon (no table)"],
            args,
            lambda w: sum(
                own_index_bytes(os.path.join(folder, f"ds{d:03d}"), args.blend_shards, w)
                for d in range(args.blend)
            ),
        )
    print(machine_summary(), flush=True)
    print_markdown_table(
        [
            "dataset",
            "loader",
            "workers",
            "after import s",
            "build s",
            "first batch s",
            "bytes read",
            "read calls",
            "own .tar.idx bytes",
        ],
        rows,
    )
    print("\nObject storage, index and metadata bytes of the rank (energon simulate's count):")
    print_markdown_table(
        [
            "dataset",
            "workers",
            "every rank",
            "own .tar.idx",
            "own shard table",
            "total",
            "total - 2 x own .tar.idx",
        ],
        remote_rows,
    )


if __name__ == "__main__":
    main()
