"""Save/restore benchmark: save time, state size, restore time and time to first batch after a
restore vs. a fresh loader, for 0 and 2 workers with shuffle buffer 100.

    python tools/benchmarks/bench_state.py [--workload captioning|text|all] [--workers 0,2] [--steps 50]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_common import ensure_workload, machine_summary, print_markdown_table  # noqa: E402

from energon import WorkerConfig, get_savable_loader, get_train_dataset  # noqa: E402
from energon.prepare.dataset import prepare_dataset  # noqa: E402

YAML = {
    "captioning": "sample_type:\n  __module__: megatron.energon\n  __class__: CaptioningSample\n"
    "field_map:\n  image: jpg\n  caption: txt\n",
    "text": "sample_type:\n  __module__: megatron.energon\n  __class__: TextSample\nfield_map:\n  text: txt\n",
}


def make_loader(root: str, workers: int):
    wc = WorkerConfig(rank=0, world_size=1, num_workers=workers)
    dataset = get_train_dataset(
        root, worker_config=wc, batch_size=32, shuffle_buffer_size=100, max_samples_per_sequence=100
    )
    return get_savable_loader(dataset)


def first_batch_seconds(loader, state=None) -> tuple[float, float, object]:
    """(restore seconds, time to first batch including restore, the iterator)."""
    t0 = time.perf_counter()
    loader.restore_state_rank(state)
    t1 = time.perf_counter()
    it = iter(loader)
    first = next(it)
    return t1 - t0, time.perf_counter() - t0, (it, first)


def measure(root: str, workload: str, workers: int, steps: int) -> tuple:
    fresh_loader = make_loader(root, workers)
    _, fresh_ttfb, (it, _) = first_batch_seconds(fresh_loader)
    for _ in range(steps):
        next(it)
    t0 = time.perf_counter()
    state = fresh_loader.save_state_rank()
    save_ms = (time.perf_counter() - t0) * 1e3
    size = len(json.dumps(state))
    expected = next(it).__key__
    del it, fresh_loader
    restored = make_loader(root, workers)
    restore_s, restored_ttfb, (_, first) = first_batch_seconds(restored, state)
    assert first.__key__ == expected, "restored loader continued elsewhere"
    return (
        workload,
        workers,
        steps,
        round(save_ms, 3),
        size,
        round(restore_s * 1e3, 3),
        round(fresh_ttfb, 3),
        round(restored_ttfb, 3),
        round(restored_ttfb / fresh_ttfb, 2),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default="all", choices=["all", "captioning", "text"])
    parser.add_argument("--workers", default="0,2")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--root", default="bench_data")
    args = parser.parse_args()
    rows = []
    for workload in ["captioning", "text"] if args.workload == "all" else [args.workload]:
        root = ensure_workload(workload, args.root).path
        prepare_dataset(root, split_parts_ratio=[("train", 1.0)], progress=False)
        yaml_path = os.path.join(root, ".nv-meta", "dataset.yaml")
        if not os.path.exists(yaml_path):
            with open(yaml_path, "w") as f:
                f.write(YAML[workload])
        for workers in [int(w) for w in args.workers.split(",")]:
            rows.append(measure(root, workload, workers, args.steps))
    print(machine_summary())
    print_markdown_table(
        (
            "workload",
            "workers",
            "steps before save",
            "save ms",
            "state bytes (JSON)",
            "restore call ms",
            "fresh TTFB s",
            "restored TTFB s",
            "restored/fresh",
        ),
        rows,
    )


if __name__ == "__main__":
    main()
