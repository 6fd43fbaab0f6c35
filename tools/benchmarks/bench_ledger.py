"""Ledger benchmark: describe one step of a 256-rank job from a state saved 10,000 steps earlier,
and from the configuration alone for growing step numbers; skip 10,000 steps; count exposures.
Baseline: the same pointer stages stepped in Python vs in C (ns per sample).

    python tools/benchmarks/bench_ledger.py [--samples 1000000] [--ranks 256] [--workers 2]
        [--batch-size 8] [--gap 10000] [--root bench_data]

Runs on one core (the process pins itself to one CPU) and reports wall-clock and CPU seconds of
the process (on a busy shared machine the CPU time is the better measure of the work). The dataset
(tiny texts in a prepared WebDataset, so sample keys come from a real index.sqlite) is made once
under ROOT.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_common import machine_summary, print_markdown_table  # noqa: E402


def ensure_dataset(root: str, samples: int, shards: int) -> str:
    from energon.demo import write_text_shards
    from energon.prepare.dataset import prepare_dataset

    path = os.path.abspath(os.path.join(root, f"ledger-text-{samples}"))
    marker = os.path.join(path, "ready.json")
    if os.path.exists(marker):
        return path
    t = time.perf_counter()
    write_text_shards(path, num_samples=samples, num_shards=shards, min_chars=5, max_chars=30)
    prepare_dataset(path, split_parts_ratio=[("train", 1.0)], progress=False)
    with open(os.path.join(path, ".nv-meta", "dataset.yaml"), "w") as f:
        f.write("sample_type:\n  __module__: megatron.energon\n  __class__: TextSample\n")
        f.write("field_map:\n  text: txt\n")
    with open(marker, "w") as f:
        json.dump({"samples": samples, "seconds": time.perf_counter() - t}, f)
    return path


def dataset_for(path: str, args: argparse.Namespace):
    from energon import WorkerConfig, get_train_dataset

    wc = WorkerConfig(rank=0, world_size=args.ranks, num_workers=args.workers)
    return get_train_dataset(
        path,
        worker_config=wc,
        batch_size=args.batch_size,
        shuffle_buffer_size=100,
        max_samples_per_sequence=100,
    )


def fresh_states(dataset) -> list[dict]:
    """Every rank's state before the first step (what a loader saves before iterating)."""
    from energon.state import make_rank_state

    fp, digest = dataset.fingerprint()
    spec = dataset.spec
    return [
        make_rank_state(
            fingerprint=fp,
            fingerprint_digest=digest,
            num_streams=spec.num_streams,
            world_size=dataset.worker_config.world_size,
            rank=rank,
            origin=0,
            consumed=0,
            pass_offset=0,
            streams={},
            micro_batch_size=spec.batch_size,
        )
        for rank in range(dataset.worker_config.world_size)
    ]


def pointer_speed(dataset, count: int) -> tuple[float, float]:
    """ns per sample of one stream's pointer stages: Python, C."""
    from energon.ledger.simulate import simulated_spec
    from energon.pipeline.pointers import build_pointer_stages
    from energon.pipeline.pointers_native import NativePointers

    spec = simulated_spec(dataset.spec)
    stages = build_pointer_stages(spec, 0)
    t = time.perf_counter()
    for _ in range(count // 20):
        stages[-1].next()
    python_ns = (time.perf_counter() - t) / (count // 20) * 1e9
    stages = build_pointer_stages(spec, 1)
    t = time.perf_counter()
    fast = NativePointers.attach(stages)
    if fast is None:
        return python_ns, float("nan")
    fast.advance(count)
    fast.write_back()
    return python_ns, (time.perf_counter() - t) / count * 1e9


class Clock:
    """Wall-clock and process CPU seconds of a block."""

    def __enter__(self) -> Clock:
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self.wall
        self.cpu = time.process_time() - self.cpu

    def row(self, what: str, samples: str) -> tuple:
        return (what, samples, round(self.wall, 2), round(self.cpu, 2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=1_000_000)
    parser.add_argument("--shards", type=int, default=100)
    parser.add_argument("--ranks", type=int, default=256)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--gap", type=int, default=10_000, help="steps between state and step")
    parser.add_argument("--config-steps", default="1000,2000,4000,8000")
    parser.add_argument("--export-steps", type=int, default=1000)
    parser.add_argument("--root", default="bench_data")
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    import torch

    torch.set_num_threads(1)
    from energon.cursor.skip import skip_steps
    from energon.ledger.exposure import export_exposures
    from energon.ledger.ledger import Ledger

    path = ensure_dataset(args.root, args.samples, args.shards)
    dataset = dataset_for(path, args)
    print(machine_summary())
    streams = dataset.spec.num_streams
    print(
        f"job: {args.ranks} ranks x {args.workers} workers = {streams} logical streams, "
        f"micro-batch {args.batch_size}, shuffle buffer 100; dataset {args.samples:,} samples"
    )
    python_ns, native_ns = pointer_speed(dataset, 2_000_000)

    saved_at = args.gap
    target = saved_at + args.gap
    per_step = args.ranks * args.batch_size

    def moved(first: int, last: int) -> str:
        """Samples the pointer stages pass to move the streams of step ``last`` from the
        positions of step ``first`` (only the streams of the described step move)."""
        items = (last - first) * args.ranks // streams
        return f"{min(args.ranks, streams) * items * args.batch_size:,}"

    with Clock() as skip_clock:
        states, _ = skip_steps(fresh_states(dataset), saved_at)
    with Clock() as state_clock:
        ledger = Ledger(dataset_for(path, args), states=states)
        records = ledger.describe_step(target)
    assert len(records) == args.ranks and all(r.samples[0].key for r in records)
    samples = sum(len(r.samples) for r in records)
    rows = [
        ("pointer stages, Python (ns/sample)", "", round(python_ns, 1), ""),
        ("pointer stages, C (ns/sample)", "", round(native_ns, 1), ""),
        skip_clock.row(f"skip {saved_at:,} steps (all ranks)", f"{saved_at * per_step:,}"),
        state_clock.row(
            f"describe step {target:,} ({samples} samples) from the state of step {saved_at:,}",
            moved(saved_at, target),
        ),
    ]
    short = min(args.gap, 1000)
    with Clock() as clock:
        Ledger(dataset_for(path, args), states=states, native=False).describe_step(saved_at + short)
    rows.append(
        clock.row(
            f"the same {short:,} steps after the state, Python stages only (--no-native)",
            moved(saved_at, saved_at + short),
        )
    )
    for step in [int(s) for s in args.config_steps.split(",")]:
        with Clock() as clock:
            Ledger(dataset_for(path, args)).describe_step(step)
        rows.append(clock.row(f"describe step {step:,} from the configuration", moved(0, step)))
    out = os.path.join(args.root, "ledger-exposure")
    with Clock() as clock:
        export_exposures(
            Ledger(dataset_for(path, args)), out, until_step=args.export_steps, progress=False
        )
    rows.append(
        clock.row(
            f"count exposures of steps 0..{args.export_steps - 1:,}",
            f"{args.export_steps * per_step:,}",
        )
    )
    print_markdown_table(["what", "samples passed", "wall s", "CPU s (1 core)"], rows)


if __name__ == "__main__":
    main()
