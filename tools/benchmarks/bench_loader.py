"""Loader benchmark: samples/s, time to first batch and peak memory, next to the raw limits.

For each workload the dataset is prepared (and given a ``dataset.yaml`` if it has none), then
every worker count runs the public API the way a training script does::

    ds = get_train_dataset(path, batch_size=32, shuffle_buffer_size=100,
                           max_samples_per_sequence=100, worker_config=WorkerConfig(...))
    for batch in get_loader(ds): ...

with the default image decoding (float32 ``torchrgb``; ``--image-decode torchrgb,torchrgb8``
also runs every worker count with uint8 batches in the same rounds; ``--fast-jpeg on,off`` also
runs them with the loader's simplejpeg path switched off, as an install without simplejpeg
loads). Each run is a fresh process: the first
320 samples are a warm-up (worker start, first buffers), then 4,000 captioning / 60,000 text
samples are timed. The peak RSS of the main process and the peak PSS of main + workers are taken
over the whole run. ``--runs`` rounds are measured (default 3) and medians reported.

In every round the raw limits are measured right after the loaders, on the same bytes (the
samples the loader reads, in shard order), by ``bench_raw``: for captioning the decode-only rate
of every JPEG decoder installed (Pillow, simplejpeg, OpenCV, imagecodecs, PyTurboJPEG where its
system library exists), with 1 process (for 0 workers) and 2 processes (for 2 workers); the limit
is the fastest. For text, tar read + UTF-8 decode. The loader / limit ratio is computed per round
(the machine's load moves both) and its median reported.

``--in-process`` runs the loaders in this process instead (full tracebacks for debugging; memory
numbers are then not those of a configuration alone).

``--compare-error-accounting N`` instead measures what counting skipped samples costs
(docs/errors.md): each configuration runs N times with the error accounting and N times without it
(streams without error accounts, a loader that observes nothing), alternating, each in a fresh
subprocess, and the medians are printed side by side with their ratio.

Usage: python tools/benchmarks/bench_loader.py [--workload captioning|text|all] [--workers 0,2]
                                    [--runs 3] [--samples N] [--root bench_data]
                                    [--compare-error-accounting N]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import statistics
import subprocess
import sys
import traceback
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_common import (  # noqa: E402
    DEFAULT_ROOT,
    WORKLOADS,
    PeakMemoryProbe,
    Timer,
    Workload,
    ensure_workload,
    machine_summary,
    mib,
    per_second,
    print_markdown_table,
    process_tree,
)
from bench_raw import (  # noqa: E402
    JPEG_DECODERS,
    TEXT_DECODE,
    RawResult,
    measure_captioning,
    measure_text,
    warm_page_cache,
)

BATCH_SIZE = 32
SHUFFLE_BUFFER_SIZE = 100
MAX_SAMPLES_PER_SEQUENCE = 100
WARMUP_SAMPLES = 320
DEFAULT_SAMPLES = {"captioning": 4000, "text": 60000}
DEFAULT_RUNS = 3
DEFAULT_BATCHES = {"captioning": 200, "text": 2000}  # run length of bench_checksums
RESULT_PREFIX = "BENCH_LOADER_RESULT "

# Written only when the dataset has no dataset.yaml yet (the prepare wizard's usual output).
DATASET_YAML = {
    "captioning": (
        "sample_type:\n"
        "  __module__: megatron.energon\n"
        "  __class__: CaptioningSample\n"
        "field_map:\n"
        "  image: jpg\n"
        "  caption: txt\n"
    ),
    "text": (
        "sample_type:\n"
        "  __module__: megatron.energon\n"
        "  __class__: TextSample\n"
        "field_map:\n"
        "  text: txt\n"
    ),
}


# ----------------------------------------------------------------------------------------------
# Preparing the dataset
# ----------------------------------------------------------------------------------------------


def ensure_dataset_yaml(workload: Workload) -> bool:
    """Write ``.nv-meta/dataset.yaml`` for the workload's sample type; False if one existed."""
    path = os.path.join(workload.path, ".nv-meta", "dataset.yaml")
    if os.path.exists(path):
        return False
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as file:
        file.write(DATASET_YAML[workload.kind])
    return True


def prepare_workload(workload: Workload, force: bool = False) -> float:
    """Run the loader's prepare step (index + split) on the workload unless it has an index
    (``force``: always; guards against metadata left by an older version of the prepare code).
    Returns seconds taken. Not by default because the benchmark data may be shared: re-preparing
    rewrites the index under other readers, and fails if something else was put in the folder."""
    from energon.prepare.dataset import prepare_dataset

    index = os.path.join(workload.path, ".nv-meta", "index.sqlite")
    with Timer() as timer:
        if force or not os.path.exists(index):
            prepare_dataset(
                workload.path,
                split_parts_ratio=[("train", 1.0), ("val", 0), ("test", 0)],
                progress=False,
            )
    ensure_dataset_yaml(workload)
    return timer.seconds


# ----------------------------------------------------------------------------------------------
# Running the loader
# ----------------------------------------------------------------------------------------------


@dataclass
class LoaderResult:
    workload: str
    workers: int
    image_decode: str = "torchrgb"
    fast_jpeg: bool = True  # False: ENERGON_NO_FAST_JPEG=1 (Pillow decodes every JPEG)
    batches: int = 0
    samples: int = 0
    timed_samples: int = 0
    time_to_first_batch: float = float("nan")
    steady_samples_per_second: float = float("nan")
    cpu_seconds: float = float("nan")  # main threads of main process and workers, decode threads
    peak_rss_main: int = 0
    peak_rss_total: int = 0
    peak_pss_total: int = 0
    torch_threads: int = 0
    first_batch: str = ""
    error: str = ""


def count_batch_samples(batch: Any, kind: str) -> int:
    """Samples in a batch, from the list field every batch of this kind has."""
    return len(batch.caption) if kind == "captioning" else len(batch.text)


def describe_batch(batch: Any, kind: str) -> str:
    """Short description of the first batch, so a wrong batch shape is visible in the table."""
    if kind == "captioning":
        image = batch.image
        shape = "x".join(str(size) for size in getattr(image, "shape", ()))
        return f"image {shape} {getattr(image, 'dtype', type(image).__name__)}"
    return f"text list[{len(batch.text)}]"


def check_first_batch(batch: Any, kind: str, image_decode: str = "torchrgb") -> None:
    """Fail loudly if the loader returns something other than what the raw limit computes."""
    if kind != "captioning":
        return
    import torch

    expected = torch.uint8 if image_decode.endswith("8") else torch.float32
    image = batch.image
    if not isinstance(image, torch.Tensor) or image.dtype != expected or image.ndim != 4:
        raise TypeError(
            f"expected batch.image {expected} [B,3,H,W], got {describe_batch(batch, kind)}"
        )


class BatchReader:
    """``--consume read``: read every byte of each batch's tensors once, as a training step's copy
    to the accelerator does (into a reused buffer, like a pinned staging buffer)."""

    def __init__(self) -> None:
        self._buffer = None

    def __call__(self, batch: Any) -> None:
        import torch

        tensor = batch.image if hasattr(batch, "image") else None
        if not isinstance(tensor, torch.Tensor):
            return
        flat = tensor.reshape(-1)
        if self._buffer is None or self._buffer.numel() < flat.numel():
            self._buffer = torch.empty(flat.numel(), dtype=flat.dtype)
        self._buffer[: flat.numel()].copy_(flat)


def run_loader(
    workload: Workload,
    workers: int,
    samples: int,
    warmup: int = WARMUP_SAMPLES,
    consume: str = "none",
    image_decode: str = "torchrgb",
) -> LoaderResult:
    """Iterate the loader like a training loop: ``warmup`` samples untimed, then ``samples``
    samples timed (in this process). Memory peaks cover the whole run, warm-up included. With
    ``consume="read"`` every batch's image tensor is also read once (see :class:`BatchReader`)."""
    import torch

    use = BatchReader() if consume == "read" else (lambda batch: None)

    from energon import (
        DefaultTaskEncoder,
        SampleDecoder,
        WorkerConfig,
        get_loader,
        get_train_dataset,
    )

    encoder = DefaultTaskEncoder()
    encoder.decoder = SampleDecoder(image_decode=image_decode)
    result = LoaderResult(
        workload.name, workers, image_decode, torch_threads=torch.get_num_threads()
    )
    gc.collect()
    with PeakMemoryProbe(pss_interval_seconds=0.5) as probe:
        with Timer() as since_start:
            worker_config = WorkerConfig(rank=0, world_size=1, num_workers=workers)
            dataset = get_train_dataset(
                workload.path,
                batch_size=BATCH_SIZE,
                shuffle_buffer_size=SHUFFLE_BUFFER_SIZE,
                max_samples_per_sequence=MAX_SAMPLES_PER_SEQUENCE,
                worker_config=worker_config,
                task_encoder=encoder,
            )
            iterator = iter(get_loader(dataset))
            first = next(iterator)
        result.time_to_first_batch = since_start.seconds
        check_first_batch(first, workload.kind, image_decode)
        result.first_batch = describe_batch(first, workload.kind)
        result.samples = count_batch_samples(first, workload.kind)
        result.batches = 1
        use(first)
        batch = first
        del first
        while result.samples < warmup:
            batch = next(iterator)
            use(batch)
            result.samples += count_batch_samples(batch, workload.kind)
            result.batches += 1
        timed = 0
        cpu_before = tree_cpu_seconds()
        with Timer() as steady:
            for batch in iterator:
                use(batch)
                timed += count_batch_samples(batch, workload.kind)
                result.batches += 1
                if timed >= samples:
                    break
        result.cpu_seconds = sum(tree_cpu_seconds(cpu_before).values())
        result.samples += timed
        result.timed_samples = timed
        result.steady_samples_per_second = per_second(timed, steady.seconds)
    result.peak_rss_main = probe.peak_rss_main
    result.peak_rss_total = probe.peak_rss_total
    result.peak_pss_total = probe.peak_pss_total
    del batch, iterator, dataset
    gc.collect()
    return result


def tree_cpu_seconds(since: dict[int, float] | None = None) -> dict[int, float]:
    """On-CPU seconds of the threads that do the loader's work, by thread id: the main thread of
    this process and of each descendant (the loader's workers) and the library's decode threads
    (``decode_threads``), from /proc/PID/task/TID/schedstat; minus ``since`` if given. Not the
    memory probe's sampling thread, nor the queues' feeder threads (as in earlier runs)."""
    out = {}
    for pid in process_tree():
        try:
            tids = [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]
        except OSError:
            continue
        for tid in tids:
            if tid != pid and not _is_decode_thread(pid, tid):
                continue
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat") as file:
                    seconds = int(file.read().split()[0]) / 1e9
            except (OSError, ValueError, IndexError):
                continue
            out[tid] = seconds - (since or {}).get(tid, 0.0)
    return out


def _is_decode_thread(pid: int, tid: int) -> bool:
    try:
        with open(f"/proc/{pid}/task/{tid}/comm") as file:
            return file.read().startswith("energon-decode")  # (names are cut to 15 characters)
    except OSError:
        return False


def disable_error_accounting() -> None:
    """For the comparison run only: streams get an error account that counts nothing, and the
    loader observes nothing (workers are forked from this process and inherit it).

    A stream cannot go without an account any more (its load stage takes the samples read per
    source from it with every sample, for a failure reported later), so the baseline is an
    account whose success-path work, that snapshot of reads, is a constant."""
    import energon.pipeline.stream as stream_module
    from energon.loader.error_report import ErrorReport
    from energon.pipeline.error_account import ErrorAccount

    class CountingNothing(ErrorAccount):
        def reads_now(self) -> tuple[int, ...]:
            return ()

        def failed(self, *args: object, **kwargs: object) -> None:
            pass

    stream_module.ErrorAccount = CountingNothing
    ErrorReport.observe = lambda self, *args: None


def run_loader_safely(
    workload: Workload,
    workers: int,
    samples: int,
    consume: str = "none",
    image_decode: str = "torchrgb",
) -> LoaderResult:
    """Like :func:`run_loader`, but an exception becomes the result's ``error``."""
    try:
        return run_loader(workload, workers, samples, consume=consume, image_decode=image_decode)
    except Exception as error:  # one broken configuration must not end the run
        traceback.print_exc()
        return LoaderResult(
            workload.name, workers, image_decode, error=f"{type(error).__name__}: {error}"
        )


def run_loader_in_subprocess(
    workload: Workload,
    workers: int,
    samples: int,
    root: str,
    timeout: float,
    torch_threads: int | None = None,
    error_accounting: bool = True,
    consume: str = "none",
    image_decode: str = "torchrgb",
    fast_jpeg: bool = True,
) -> LoaderResult:
    """Run one configuration in a fresh interpreter; it reports back one JSON line on stdout."""
    command = [
        sys.executable,
        os.path.abspath(__file__),
        "--run-one",
        "--workload",
        workload.name,
        "--workers",
        str(workers),
        "--samples",
        str(samples),
        "--root",
        root,
    ]
    if torch_threads is not None:
        command += ["--torch-threads", str(torch_threads)]
    if not error_accounting:
        command.append("--no-error-accounting")
    if consume != "none":
        command += ["--consume", consume]
    if image_decode != "torchrgb":
        command += ["--image-decode", image_decode]
    env = {**os.environ, "ENERGON_NO_FAST_JPEG": "" if fast_jpeg else "1"}
    try:
        completed = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout, check=False, env=env
        )
    except subprocess.TimeoutExpired:
        return LoaderResult(
            workload.name, workers, image_decode, error=f"timed out after {timeout:.0f} s"
        )
    for line in reversed(completed.stdout.splitlines()):
        if line.startswith(RESULT_PREFIX):
            return replace(
                LoaderResult(**json.loads(line[len(RESULT_PREFIX) :])), fast_jpeg=fast_jpeg
            )
    stderr_tail = " / ".join(completed.stderr.strip().splitlines()[-3:])
    return LoaderResult(
        workload.name,
        workers,
        image_decode,
        error=f"exit code {completed.returncode}: {stderr_tail}",
    )


# ----------------------------------------------------------------------------------------------
# Raw limits and the report
# ----------------------------------------------------------------------------------------------


def raw_limits(
    workload: Workload, worker_counts: Sequence[int], samples: int
) -> dict[int, dict[str, RawResult]]:
    """Raw rates per process count (a worker count of 0 means the main process does the work,
    i.e. 1 process), over as many samples as the loader reads, in shard order: decode-only per
    installed JPEG decoder for images, tar read + UTF-8 decode for text."""
    process_counts = sorted({max(1, workers) for workers in worker_counts})
    limit = min(samples, workload.spec.num_samples)
    if workload.kind == "captioning":
        results = measure_captioning(workload, limit, process_counts, JPEG_DECODERS)
    else:
        results = measure_text(workload, limit, process_counts, [TEXT_DECODE])
    out: dict[int, dict[str, RawResult]] = {}
    for result in results:
        out.setdefault(result.processes, {})[result.measurement] = result
    return out


def fastest_limit(raws: dict[str, RawResult]) -> tuple[str, float] | None:
    """The limit of one process count: the fastest raw rate (the fastest decoder for images)."""
    if not raws:
        return None
    best = max(raws.values(), key=lambda raw: raw.samples_per_second)
    return best.measurement, best.samples_per_second


@dataclass
class Round:
    """One round: every loader configuration, then the raw limits, measured back to back."""

    loaders: list[LoaderResult]
    limits: dict[int, dict[str, RawResult]]

    def ratio(self, result: LoaderResult) -> float | None:
        limit = fastest_limit(self.limits.get(max(1, result.workers), {}))
        if limit is None or result.error:
            return None
        return result.steady_samples_per_second / limit[1]

    def cpu_ratio(self, result: LoaderResult) -> float | None:
        """Loader samples per CPU-second over the fastest decoder's (same process count)."""
        raws = self.limits.get(max(1, result.workers), {})
        rates = [r.samples_per_cpu_second for r in raws.values() if r.cpu_seconds]
        if not rates or result.error or not result.cpu_seconds:
            return None
        return per_second(result.timed_samples, result.cpu_seconds) / max(rates)


REPORT_HEADERS = (
    "workload",
    "output",
    "workers",
    "runs",
    "TTFB s",
    "loader samples/s (median; runs)",
    "limit samples/s (median)",
    "loader/limit (median; runs)",
    "per CPU-second: loader/limit (median)",
    "CPU ms per sample (median)",
    "peak RSS main MiB (max)",
    "peak PSS main+workers MiB (max)",
    "first batch / error",
)


def _output_name(result: LoaderResult) -> str:
    name = "uint8" if result.image_decode.endswith("8") else "float32"
    return name if result.fast_jpeg else f"{name}, Pillow only"


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def _runs(values: Sequence[float], digits: int = 0) -> str:
    return " / ".join(f"{value:,.{digits}f}" for value in values)


def report_rows(rounds: Sequence[Round]) -> list[tuple[object, ...]]:
    """One row per loader configuration, over all rounds."""
    rows = []
    for index, first in enumerate(rounds[0].loaders):
        results = [round_.loaders[index] for round_ in rounds]
        good = [(r, round_) for r, round_ in zip(results, rounds) if not r.error]
        rates = [r.steady_samples_per_second for r, _ in good]
        ratios = [ratio for r, round_ in good if (ratio := round_.ratio(r)) is not None]
        cpu_ratios = [c for r, round_ in good if (c := round_.cpu_ratio(r)) is not None]
        limits = [
            limit[1]
            for round_ in rounds
            if (limit := fastest_limit(round_.limits.get(max(1, first.workers), {})))
        ]
        errors = [r.error for r in results if r.error]
        cpu_ms = [1000 * r.cpu_seconds / r.timed_samples for r, _ in good if r.timed_samples]
        rows.append(
            (
                first.workload,
                _output_name(first) if first.workload.startswith("captioning") else "",
                first.workers,
                len(good),
                _median([r.time_to_first_batch for r, _ in good]),
                f"{_median(rates):,.0f} ({_runs(rates)})" if rates else None,
                _median(limits),
                f"{_median(ratios):.2f} ({_runs(ratios, 2)})" if ratios else None,
                _median(cpu_ratios),
                _median(cpu_ms),
                mib(max(r.peak_rss_main for r, _ in good)) if good else None,
                mib(max(r.peak_pss_total for r, _ in good)) if good else None,
                "; ".join(errors) if errors else first.first_batch,
            )
        )
    return rows


LIMIT_HEADERS = (
    "workload",
    "measurement",
    "processes",
    "samples",
    "samples/s (median; runs)",
    "samples per CPU-second (median)",
)


def limit_rows(name: str, rounds: Sequence[Round]) -> list[tuple[object, ...]]:
    """Every raw measurement of a workload, medians over rounds."""
    keys = sorted({(p, m) for round_ in rounds for p, raws in round_.limits.items() for m in raws})
    rows = []
    for processes, measurement in keys:
        raws = [
            r.limits[processes][measurement]
            for r in rounds
            if measurement in r.limits.get(processes, {})
        ]
        rates = [raw.samples_per_second for raw in raws]
        cpu_rates = [raw.samples_per_cpu_second for raw in raws if raw.cpu_seconds]
        rows.append(
            (
                name,
                measurement,
                processes,
                raws[0].samples,
                f"{_median(rates):,.0f} ({_runs(rates)})",
                _median(cpu_rates),
            )
        )
    return rows


# ----------------------------------------------------------------------------------------------
# CLI
# ----------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default="all", choices=["all", *WORKLOADS])
    parser.add_argument("--workers", default="0,2", help="comma-separated worker counts")
    parser.add_argument(
        "--samples",
        type=int,
        default=None,
        help=f"timed samples per run, after {WARMUP_SAMPLES} warm-up samples "
        f"(default {DEFAULT_SAMPLES})",
    )
    parser.add_argument(
        "--batches", type=int, default=None, help="timed batches per run (instead of --samples)"
    )
    parser.add_argument(
        "--consume",
        default="none",
        choices=["none", "read"],
        help="what the loop does with a batch: nothing (the issue's harness), or read its image "
        "tensor once as a copy to the accelerator would",
    )
    parser.add_argument(
        "--image-decode",
        default="torchrgb",
        help="the datasets' image_decode, comma-separated to run several in the same rounds "
        "(default torchrgb: float32 in [0, 1]; torchrgb8: uint8)",
    )
    parser.add_argument(
        "--fast-jpeg",
        default="on",
        help="on, off or on,off: the loader's simplejpeg path (off: ENERGON_NO_FAST_JPEG=1, "
        "what an install without simplejpeg does); the raw limits always include simplejpeg",
    )
    parser.add_argument(
        "--prepare", action="store_true", help="prepare the workload even if it has an index"
    )
    parser.add_argument("--runs", type=int, default=DEFAULT_RUNS, help="rounds (median reported)")
    parser.add_argument("--root", default=DEFAULT_ROOT, help="workload cache directory")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per configuration")
    parser.add_argument(
        "--in-process", action="store_true", help="run configurations in this process"
    )
    parser.add_argument(
        "--torch-threads",
        type=int,
        default=None,
        help="torch intra-op threads of the main process (default: torch's own default); "
        "matters for 0 workers, where decoding and batching run in the main process",
    )
    parser.add_argument(
        "--compare-error-accounting",
        type=int,
        default=0,
        metavar="N",
        help="run every configuration N times with and N times without error accounting "
        "(alternating) and print the medians",
    )
    parser.add_argument("--run-one", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--no-error-accounting", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def timed_samples(args: argparse.Namespace, kind: str) -> int:
    if args.samples:
        return args.samples
    if args.batches:
        return args.batches * BATCH_SIZE
    return DEFAULT_SAMPLES[kind]


def run_one(args: argparse.Namespace) -> None:
    """Child mode: one workload, one worker count, result as a JSON line on stdout."""
    workload = ensure_workload(args.workload, args.root, progress=False)
    if args.no_error_accounting:
        disable_error_accounting()
    result = run_loader_safely(
        workload,
        int(args.workers),
        timed_samples(args, workload.kind),
        args.consume,
        args.image_decode,
    )
    # A fresh process's own high-water mark is exact, and catches peaks the probe samples miss.
    own_max_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    if not result.error and own_max_rss > result.peak_rss_main:
        result.peak_rss_total += own_max_rss - result.peak_rss_main
        result.peak_rss_main = own_max_rss
    print(RESULT_PREFIX + json.dumps(asdict(result)), flush=True)


def image_configurations(args: argparse.Namespace, kind: str) -> list[tuple[str, bool]]:
    """(image_decode, fast JPEG path) pairs to run (text has no images: one run per worker
    count)."""
    if kind != "captioning":
        return [("torchrgb", True)]
    fast = {"on": True, "off": False}
    switches = [fast[value] for value in args.fast_jpeg.split(",")]
    return [(mode, on) for on in switches for mode in args.image_decode.split(",")]


def benchmark_round(
    workload: Workload, worker_counts: Sequence[int], args: argparse.Namespace
) -> Round:
    """Every loader configuration in a fresh process, then the raw limits on the same bytes."""
    samples = timed_samples(args, workload.kind)
    print(f"# round of {workload.name}: {machine_summary()}", flush=True)
    results = []
    for workers in worker_counts:
        for image_decode, fast_jpeg in image_configurations(args, workload.kind):
            print(
                f"# {workload.name}: {workers} workers, {image_decode}, fast JPEG {fast_jpeg}, "
                f"{samples} samples ...",
                flush=True,
            )
            if args.in_process:
                os.environ["ENERGON_NO_FAST_JPEG"] = "" if fast_jpeg else "1"
                result = run_loader_safely(workload, workers, samples, args.consume, image_decode)
                result.fast_jpeg = fast_jpeg
            else:
                result = run_loader_in_subprocess(
                    workload,
                    workers,
                    samples,
                    args.root,
                    args.timeout,
                    args.torch_threads,
                    consume=args.consume,
                    image_decode=image_decode,
                    fast_jpeg=fast_jpeg,
                )
            results.append(result)
            print(f"#   {result.steady_samples_per_second:,.0f} samples/s {result.error}")
    try:
        limits = raw_limits(workload, worker_counts, samples + WARMUP_SAMPLES)
    except Exception:  # the loader numbers are still worth printing
        traceback.print_exc()
        limits = {}
    return Round(results, limits)


def benchmark_workload(
    name: str, worker_counts: Sequence[int], args: argparse.Namespace
) -> tuple[list[tuple[object, ...]], list[tuple[object, ...]]]:
    """All rounds of one workload; returns the loader rows and the raw-limit rows."""
    workload = ensure_workload(name, args.root)
    try:
        prepare_seconds = prepare_workload(workload, args.prepare)
        print(f"# {name}: prepared in {prepare_seconds:.2f} s", flush=True)
    except Exception as error:  # reported in the table like any other failure
        traceback.print_exc()
        message = f"prepare failed: {type(error).__name__}: {error}"
        failed = Round(
            [LoaderResult(name, workers, error=message) for workers in worker_counts], {}
        )
        return report_rows([failed]), []
    warm_page_cache(workload)
    rounds = [benchmark_round(workload, worker_counts, args) for _ in range(args.runs)]
    return report_rows(rounds), limit_rows(name, rounds)


COMPARE_HEADERS = (
    "workload",
    "workers",
    "runs each",
    "median samples/s with accounting",
    "median samples/s without",
    "with / without (medians)",
    "median of paired ratios",
    "ratios run by run",
)


def compare_error_accounting(
    name: str, worker_counts: Sequence[int], args: argparse.Namespace
) -> list[tuple[object, ...]]:
    """Median throughput with and without error accounting, runs alternating (noise hits both)."""
    workload = ensure_workload(name, args.root)
    prepare_workload(workload, args.prepare)
    warm_page_cache(workload)
    samples = timed_samples(args, workload.kind)
    rows = []
    for workers in worker_counts:
        rates: dict[bool, list[float]] = {True: [], False: []}
        for run in range(args.compare_error_accounting):
            for accounting in (True, False) if run % 2 == 0 else (False, True):
                print(
                    f"# {name}: {workers} workers, accounting={accounting}, run {run}", flush=True
                )
                result = run_loader_in_subprocess(
                    workload,
                    workers,
                    samples,
                    args.root,
                    args.timeout,
                    args.torch_threads,
                    error_accounting=accounting,
                )
                if result.error:
                    raise RuntimeError(result.error)
                rates[accounting].append(result.steady_samples_per_second)
        with_, without = statistics.median(rates[True]), statistics.median(rates[False])
        ratios = [a / b for a, b in zip(rates[True], rates[False])]
        rows.append(
            (
                name,
                workers,
                len(ratios),
                with_,
                without,
                with_ / without,
                statistics.median(ratios),
                " ".join(f"{r:.2f}" for r in ratios),
            )
        )
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.torch_threads is not None:
        import torch

        torch.set_num_threads(args.torch_threads)
    if args.run_one:
        run_one(args)
        return
    worker_counts = [int(count) for count in args.workers.split(",")]
    names = ["captioning", "text"] if args.workload == "all" else [args.workload]
    if args.compare_error_accounting:
        rows = [r for name in names for r in compare_error_accounting(name, worker_counts, args)]
        print(f"\n{machine_summary()}\n")
        print_markdown_table(COMPARE_HEADERS, rows)
        return
    rows: list[tuple[object, ...]] = []
    limits: list[tuple[object, ...]] = []
    for name in names:
        loader_rows, limit_rows_ = benchmark_workload(name, worker_counts, args)
        rows.extend(loader_rows)
        limits.extend(limit_rows_)
    print(f"\n{machine_summary()}\n")
    print_markdown_table(REPORT_HEADERS, rows)
    print()
    print_markdown_table(LIMIT_HEADERS, limits)


if __name__ == "__main__":
    main()
