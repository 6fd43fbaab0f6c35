"""What per-sample checksums (``energon prepare --checksums``) cost the loader: throughput with and
without verification, measured in the same run on the same bytes.

The workload is prepared with checksums; a second view of it shares the shards and tar indices but
has no ``.nv-meta/checksums`` (so nothing is verified). The two are run in pairs, ``--repeats``
times (A B, B A, A B, ...: the order alternates), so that drifts of a noisy, shared machine hit
both alike; the report gives the median samples/s of each and the median of the per-pair ratios.

    python tools/benchmarks/bench_checksums.py [--workload captioning|text|all] [--workers 0,2]
                                               [--repeats 5] [--batches N] [--root bench_data]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import statistics
import sys
from collections.abc import Sequence

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_common import (  # noqa: E402
    DEFAULT_ROOT,
    WORKLOADS,
    Workload,
    ensure_workload,
    machine_summary,
    print_markdown_table,
)
from bench_loader import (  # noqa: E402
    BATCH_SIZE,
    DEFAULT_BATCHES,
    ensure_dataset_yaml,
    run_loader,
)
from bench_raw import warm_page_cache  # noqa: E402

from energon.format.layout import CHECKSUMS_FOLDER_NAME, MAIN_FOLDER_NAME  # noqa: E402
from energon.prepare.dataset import prepare_dataset  # noqa: E402


def prepare_both(workload: Workload) -> Workload:
    """Prepare the workload with checksums; return a view of it without them."""
    prepare_dataset(
        workload.path,
        split_parts_ratio=[("train", 1.0), ("val", 0), ("test", 0)],
        progress=False,
        checksums=True,
    )
    ensure_dataset_yaml(workload)
    view = f"{workload.path}-no-checksums"
    shutil.rmtree(view, ignore_errors=True)
    os.makedirs(view)
    for name in os.listdir(workload.path):  # the shard folders, shared
        if name != MAIN_FOLDER_NAME:
            os.symlink(os.path.join(workload.path, name), os.path.join(view, name))
    shutil.copytree(
        os.path.join(workload.path, MAIN_FOLDER_NAME),
        os.path.join(view, MAIN_FOLDER_NAME),
        ignore=shutil.ignore_patterns(CHECKSUMS_FOLDER_NAME),
    )
    return dataclasses.replace(workload, path=view)


def measure(name: str, workers: int, repeats: int, batches: int | None, root: str) -> tuple:
    checked = ensure_workload(name, root)
    plain = prepare_both(checked)
    warm_page_cache(checked)
    count = (batches or DEFAULT_BATCHES[checked.kind]) * BATCH_SIZE  # timed samples
    with_sums, without, ratios = [], [], []
    for i in range(repeats):
        print(f"# {name}: {workers} workers, repeat {i + 1}/{repeats}", flush=True)
        if i % 2:  # alternate which goes first, so that order effects cancel out
            b = run_loader(checked, workers, count)
            a = run_loader(plain, workers, count)
        else:
            a = run_loader(plain, workers, count)
            b = run_loader(checked, workers, count)
        if a.error or b.error:
            raise RuntimeError(a.error or b.error)
        without.append(a.steady_samples_per_second)
        with_sums.append(b.steady_samples_per_second)
        ratios.append(b.steady_samples_per_second / a.steady_samples_per_second)
    row = (
        name,
        workers,
        count,
        repeats,
        statistics.median(without),
        statistics.median(with_sums),
        statistics.median(ratios),
        f"{min(ratios):.3f}..{max(ratios):.3f}",
    )
    print(f"# result: {row}", flush=True)  # each row as soon as it is known
    return row


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default="all", choices=["all", *WORKLOADS])
    parser.add_argument("--workers", default="0,2", help="comma-separated worker counts")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batches", type=int, default=None)
    parser.add_argument("--root", default=DEFAULT_ROOT, help="workload cache directory")
    args = parser.parse_args(argv)
    names = ["captioning", "text"] if args.workload == "all" else [args.workload]
    rows = [
        measure(name, int(workers), args.repeats, args.batches, args.root)
        for name in names
        for workers in args.workers.split(",")
    ]
    print(f"\n{machine_summary()}\n")
    print_markdown_table(
        (
            "workload",
            "workers",
            "batches",
            "repeats",
            "no checksums samples/s (median)",
            "checksums samples/s (median)",
            "ratio (median of pairs)",
            "ratio range",
        ),
        rows,
    )


if __name__ == "__main__":
    main()
