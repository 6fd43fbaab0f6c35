"""Raw speed limits on the benchmark workloads: what plain Python does with the same bytes.

The loader benchmark is only meaningful next to these numbers. Each measurement reads the
shards with Python's ``tarfile`` (deliberately not the loader's own parser) and does the least
work that produces what the loader produces:

* file read: plain sequential reads of every shard (page-cache / disk ceiling),
* tar read: iterate members and read every payload,
* JPEG decode: Pillow decode of every ``.jpg`` to RGB uint8, and the same with the libjpeg-turbo
  bindings from PyPI that are installed (simplejpeg; PyTurboJPEG, which also needs the system's
  libturbojpeg): decode only, the fastest is the decode limit,
* decode + float + pad-stack: the above, then float32 CHW in [0, 1] and batches of 32 padded to
  the largest image, which is what a CaptioningSample batch contains,
* text: read + UTF-8 decode of every ``.txt``,

with 1 process and with N processes (shards spread over a pool, like loader workers; batches are
not sent back to the parent, so this is an upper bound for a multi-worker loader).

Usage: python tools/benchmarks/bench_raw.py --workload captioning|text|all [--root bench_data] [--limit N]
"""

from __future__ import annotations

import argparse
import functools
import io
import multiprocessing
import os
import sys
import tarfile
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from PIL import Image

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_common import (  # noqa: E402
    DEFAULT_ROOT,
    WORKLOADS,
    Timer,
    Workload,
    ensure_workload,
    machine_summary,
    megabytes_per_second,
    per_second,
    print_markdown_table,
)

BATCH_SIZE = 32
# Pillow hands numpy a read-only buffer; the tensor made from it is only read, never written.
warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
_READ_CHUNK = 8 * 1024 * 1024


# ----------------------------------------------------------------------------------------------
# Work units
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ShardTask:
    """One shard to process; ``max_samples`` cuts it short to honour ``--limit``."""

    path: str
    max_samples: int | None = None


@dataclass
class Tally:
    """What a measurement got through; summed over shards and processes."""

    samples: int = 0
    payload_bytes: int = 0
    batches: int = 0
    cpu_seconds: float = 0.0  # CPU time of the thread that did the work (decode measurements)

    def __add__(self, other: Tally) -> Tally:
        return Tally(
            self.samples + other.samples,
            self.payload_bytes + other.payload_bytes,
            self.batches + other.batches,
            self.cpu_seconds + other.cpu_seconds,
        )


def plan_tasks(workload: Workload, limit: int | None) -> list[ShardTask]:
    """Shards in order, the last one truncated so that at most ``limit`` samples are read."""
    if limit is None:
        return [ShardTask(path) for path in workload.shard_paths]
    tasks, remaining = [], limit
    counts = _samples_per_shard(workload)
    for path, count in zip(workload.shard_paths, counts):
        if remaining <= 0:
            break
        tasks.append(ShardTask(path, min(count, remaining)))
        remaining -= count
    return tasks


def _samples_per_shard(workload: Workload) -> list[int]:
    base, remainder = divmod(workload.spec.num_samples, workload.spec.num_shards)
    return [base + (1 if shard < remainder else 0) for shard in range(workload.spec.num_shards)]


def iter_payloads(task: ShardTask, extension: str) -> Iterator[bytes]:
    """Payloads of the members named ``*.<extension>`` of one shard, via ``tarfile``."""
    suffix = "." + extension
    yielded = 0
    with tarfile.open(task.path, "r:") as tar:
        for member in tar:
            if task.max_samples is not None and yielded >= task.max_samples:
                return
            if not member.isfile() or not member.name.endswith(suffix):
                continue
            file = tar.extractfile(member)
            assert file is not None
            yield file.read()
            yielded += 1


# ----------------------------------------------------------------------------------------------
# Per-shard measurements (top-level functions so a process pool can run them)
# ----------------------------------------------------------------------------------------------


def read_file_shard(task: ShardTask) -> Tally:
    """Plain sequential read of the whole file: the I/O ceiling (ignores ``max_samples``)."""
    total = 0
    with open(task.path, "rb", buffering=0) as file:
        while chunk := file.read(_READ_CHUNK):
            total += len(chunk)
    return Tally(samples=0, payload_bytes=total)


def _read_tar_shard(task: ShardTask, sample_extension: str) -> Tally:
    """Read every member's payload; a sample is counted per ``sample_extension`` member."""
    tally = Tally()
    samples_seen = 0
    suffix = "." + sample_extension
    with tarfile.open(task.path, "r:") as tar:
        for member in tar:
            if not member.isfile():
                continue
            if member.name.endswith(suffix):
                if task.max_samples is not None and samples_seen >= task.max_samples:
                    break
                samples_seen += 1
            file = tar.extractfile(member)
            assert file is not None
            tally.payload_bytes += len(file.read())
    tally.samples = samples_seen
    return tally


def read_tar_captioning_shard(task: ShardTask) -> Tally:
    return _read_tar_shard(task, "jpg")


def read_tar_text_shard(task: ShardTask) -> Tally:
    return _read_tar_shard(task, "txt")


def decode_rgb(payload: bytes) -> np.ndarray:
    """JPEG bytes -> HWC uint8 RGB array, the way an image decoder has to at the least."""
    with Image.open(io.BytesIO(payload)) as image:
        return np.asarray(image.convert("RGB"))


def to_float_chw(rgb: np.ndarray) -> torch.Tensor:
    """HWC uint8 -> contiguous float32 CHW in [0, 1] (what a ``torchrgb`` decoder yields)."""
    chw = torch.from_numpy(rgb).permute(2, 0, 1)
    return chw.to(torch.float32, memory_format=torch.contiguous_format).div_(255.0)


def pad_stack(images: Sequence[torch.Tensor]) -> torch.Tensor:
    """Stack CHW tensors of different sizes into one zero-padded [B, C, Hmax, Wmax] tensor."""
    channels = images[0].shape[0]
    height = max(image.shape[1] for image in images)
    width = max(image.shape[2] for image in images)
    batch = images[0].new_zeros((len(images), channels, height, width))
    for index, image in enumerate(images):
        batch[index, :, : image.shape[1], : image.shape[2]] = image
    return batch


def decode_rgb_simplejpeg(payload: bytes) -> np.ndarray:
    """JPEG bytes -> HWC uint8 RGB with simplejpeg (libjpeg-turbo, accurate DCT and upsampling)."""
    import simplejpeg

    return simplejpeg.decode_jpeg(payload, colorspace="RGB", fastdct=False, fastupsample=False)


_turbojpeg: list = []


def decode_rgb_turbojpeg(payload: bytes) -> np.ndarray:
    """JPEG bytes -> HWC uint8 RGB with PyTurboJPEG (needs the system's libturbojpeg)."""
    if not _turbojpeg:
        from turbojpeg import TJPF_RGB, TurboJPEG

        _turbojpeg.extend([TurboJPEG(), TJPF_RGB])
    decoder, rgb = _turbojpeg
    return decoder.decode(payload, pixel_format=rgb)


@functools.cache
def _opencv() -> Any:
    """OpenCV, set up once per process to decode on one thread, as in a loader worker."""
    import cv2

    cv2.setNumThreads(1)
    return cv2


def decode_rgb_opencv(payload: bytes) -> np.ndarray:
    """JPEG bytes -> HWC uint8 RGB with OpenCV (``opencv-python-headless``, its own libjpeg-turbo)."""
    cv2 = _opencv()
    return cv2.imdecode(np.frombuffer(payload, np.uint8), cv2.IMREAD_COLOR_RGB)


def decode_rgb_imagecodecs(payload: bytes) -> np.ndarray:
    """JPEG bytes -> HWC uint8 RGB with imagecodecs (its own libjpeg-turbo)."""
    import imagecodecs

    return imagecodecs.jpeg8_decode(payload)


def _decode_shard(task: ShardTask, decode: Callable[[bytes], np.ndarray]) -> Tally:
    tally = Tally()
    started = time.thread_time()
    for payload in iter_payloads(task, "jpg"):
        decode(payload)
        tally.samples += 1
        tally.payload_bytes += len(payload)
    tally.cpu_seconds = time.thread_time() - started
    return tally


def jpeg_decode_shard(task: ShardTask) -> Tally:
    return _decode_shard(task, decode_rgb)


def simplejpeg_decode_shard(task: ShardTask) -> Tally:
    return _decode_shard(task, decode_rgb_simplejpeg)


def turbojpeg_decode_shard(task: ShardTask) -> Tally:
    return _decode_shard(task, decode_rgb_turbojpeg)


def opencv_decode_shard(task: ShardTask) -> Tally:
    return _decode_shard(task, decode_rgb_opencv)


def imagecodecs_decode_shard(task: ShardTask) -> Tally:
    return _decode_shard(task, decode_rgb_imagecodecs)


def jpeg_batches_shard(task: ShardTask) -> Tally:
    """Decode + float conversion + pad-stack into batches of 32 (a partial batch at the end)."""
    tally = Tally()
    pending: list[torch.Tensor] = []
    for payload in iter_payloads(task, "jpg"):
        pending.append(to_float_chw(decode_rgb(payload)))
        tally.samples += 1
        tally.payload_bytes += len(payload)
        if len(pending) == BATCH_SIZE:
            pad_stack(pending)
            tally.batches += 1
            pending = []
    if pending:
        pad_stack(pending)
        tally.batches += 1
    return tally


def text_decode_shard(task: ShardTask) -> Tally:
    tally = Tally()
    started = time.thread_time()
    for payload in iter_payloads(task, "txt"):
        payload.decode("utf-8")
        tally.samples += 1
        tally.payload_bytes += len(payload)
    tally.cpu_seconds = time.thread_time() - started
    return tally


# ----------------------------------------------------------------------------------------------
# Running measurements
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RawResult:
    workload: str
    measurement: str
    processes: int
    samples: int
    payload_bytes: int
    seconds: float
    cpu_seconds: float = 0.0

    @property
    def samples_per_second(self) -> float:
        return per_second(self.samples, self.seconds)

    @property
    def samples_per_cpu_second(self) -> float:
        """Samples per second of CPU time: what the rate would be on otherwise idle cores."""
        return per_second(self.samples, self.cpu_seconds) if self.cpu_seconds else float("nan")

    @property
    def megabytes_per_second(self) -> float:
        return megabytes_per_second(self.payload_bytes, self.seconds)


@contextmanager
def single_torch_thread() -> Iterator[None]:
    """One intra-op thread, as in a loader worker, so '1 process' really means one core."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def _pool_initializer() -> None:
    torch.set_num_threads(1)


def _noop(_: int) -> None:
    return None


def run_over_shards(
    measure_shard: Callable[[ShardTask], Tally], tasks: Sequence[ShardTask], processes: int
) -> tuple[Tally, float]:
    """Run ``measure_shard`` over all tasks; returns the total tally and wall seconds.

    With several processes the pool is started and warmed up before the clock starts, since a
    loader's worker start-up belongs to time-to-first-batch, not to throughput.
    """
    if processes <= 1:
        with single_torch_thread(), Timer() as timer:
            tally = sum((measure_shard(task) for task in tasks), Tally())
        return tally, timer.seconds
    with multiprocessing.get_context().Pool(processes, initializer=_pool_initializer) as pool:
        pool.map(_noop, range(processes))
        with Timer() as timer:
            tally = sum(pool.imap_unordered(measure_shard, tasks), Tally())
    return tally, timer.seconds


def measure(
    workload: Workload,
    measurement: str,
    measure_shard: Callable[[ShardTask], Tally],
    tasks: Sequence[ShardTask],
    processes: int,
) -> RawResult:
    tally, seconds = run_over_shards(measure_shard, tasks, processes)
    return RawResult(
        workload.name,
        measurement,
        processes,
        tally.samples,
        tally.payload_bytes,
        seconds,
        tally.cpu_seconds,
    )


# Names of measurements, shared with bench_loader so it can pick the matching raw limit.
FILE_READ = "file read (8 MiB chunks)"
TAR_READ = "tarfile read all members"
JPEG_DECODE = "JPEG decode to RGB uint8"
SIMPLEJPEG_DECODE = "JPEG decode to RGB uint8, simplejpeg"
TURBOJPEG_DECODE = "JPEG decode to RGB uint8, PyTurboJPEG"
OPENCV_DECODE = "JPEG decode to RGB uint8, OpenCV"
IMAGECODECS_DECODE = "JPEG decode to RGB uint8, imagecodecs"
# every decode-only measurement; the optional ones run where their package is installed
JPEG_DECODERS = (
    JPEG_DECODE,
    SIMPLEJPEG_DECODE,
    TURBOJPEG_DECODE,
    OPENCV_DECODE,
    IMAGECODECS_DECODE,
)
JPEG_BATCHES = "decode + float CHW + pad-stack 32"
TEXT_DECODE = "tar read + UTF-8 decode"


def warm_page_cache(workload: Workload) -> None:
    """Read every shard once so that the first measurement is not the only one paying for I/O."""
    for path in workload.shard_paths:
        read_file_shard(ShardTask(path))


def available_jpeg_decoders() -> dict[str, Callable[[ShardTask], Tally]]:
    """Decode-only measurements of the JPEG decoders installed here (Pillow always); a binding that
    imports but cannot decode (PyTurboJPEG without the system library) is left out."""
    decoders: dict[str, Callable[[ShardTask], Tally]] = {JPEG_DECODE: jpeg_decode_shard}
    probe = _tiny_jpeg()
    for name, shard, decode in (
        (SIMPLEJPEG_DECODE, simplejpeg_decode_shard, decode_rgb_simplejpeg),
        (TURBOJPEG_DECODE, turbojpeg_decode_shard, decode_rgb_turbojpeg),
        (OPENCV_DECODE, opencv_decode_shard, decode_rgb_opencv),
        (IMAGECODECS_DECODE, imagecodecs_decode_shard, decode_rgb_imagecodecs),
    ):
        try:
            decode(probe)
        except Exception:  # not installed, or no system library
            continue
        decoders[name] = shard
    return decoders


def _tiny_jpeg() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), (10, 20, 30)).save(buffer, format="JPEG")
    return buffer.getvalue()


def measure_captioning(
    workload: Workload,
    limit: int | None = None,
    processes: Sequence[int] = (1, 2),
    measurements: Sequence[str] = (FILE_READ, TAR_READ, *JPEG_DECODERS, JPEG_BATCHES),
) -> list[RawResult]:
    """Raw limits for a captioning workload; I/O ones with 1 process, compute ones with each."""
    tasks = plan_tasks(workload, limit)
    warm_page_cache(workload)
    results = []
    if FILE_READ in measurements:
        results.append(measure(workload, FILE_READ, read_file_shard, tasks, 1))
    if TAR_READ in measurements:
        results.append(measure(workload, TAR_READ, read_tar_captioning_shard, tasks, 1))
    decoders = available_jpeg_decoders()
    for count in processes:
        for name, shard in decoders.items():
            if name in measurements:
                results.append(measure(workload, name, shard, tasks, count))
        if JPEG_BATCHES in measurements:
            results.append(measure(workload, JPEG_BATCHES, jpeg_batches_shard, tasks, count))
    return results


def measure_text(
    workload: Workload,
    limit: int | None = None,
    processes: Sequence[int] = (1, 2),
    measurements: Sequence[str] = (FILE_READ, TAR_READ, TEXT_DECODE),
) -> list[RawResult]:
    """Raw limits for a text workload: reading, and reading + UTF-8 decoding."""
    tasks = plan_tasks(workload, limit)
    warm_page_cache(workload)
    results = []
    if FILE_READ in measurements:
        results.append(measure(workload, FILE_READ, read_file_shard, tasks, 1))
    if TAR_READ in measurements:
        results.append(measure(workload, TAR_READ, read_tar_text_shard, tasks, 1))
    for count in processes:
        if TEXT_DECODE in measurements:
            results.append(measure(workload, TEXT_DECODE, text_decode_shard, tasks, count))
    return results


def measure_workload(
    workload: Workload, limit: int | None = None, processes: Sequence[int] = (1, 2)
) -> list[RawResult]:
    if workload.kind == "captioning":
        return measure_captioning(workload, limit, processes)
    return measure_text(workload, limit, processes)


def loader_equivalent_measurement(kind: str) -> str:
    """The raw measurement that does the same work as the loader for a workload kind."""
    return JPEG_BATCHES if kind == "captioning" else TEXT_DECODE


RESULT_HEADERS = ("workload", "measurement", "procs", "samples", "seconds", "samples/s", "MB/s")


def result_row(result: RawResult) -> tuple[object, ...]:
    # A plain file read knows bytes, not samples: leave those cells empty rather than zero.
    samples = result.samples if result.samples else None
    samples_per_second = result.samples_per_second if result.samples else None
    return (
        result.workload,
        result.measurement,
        result.processes,
        samples,
        result.seconds,
        samples_per_second,
        result.megabytes_per_second,
    )


# ----------------------------------------------------------------------------------------------
# CLI
# ----------------------------------------------------------------------------------------------


def workload_names(choice: str) -> list[str]:
    return ["captioning", "text"] if choice == "all" else [choice]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default="all", choices=["all", *WORKLOADS])
    parser.add_argument("--root", default=DEFAULT_ROOT, help="workload cache directory")
    parser.add_argument("--limit", type=int, default=None, help="read at most N samples")
    parser.add_argument(
        "--processes", default="1,2", help="process counts for the compute measurements"
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    processes = [int(count) for count in args.processes.split(",")]
    results: list[RawResult] = []
    for name in workload_names(args.workload):
        workload = ensure_workload(name, args.root)
        print(
            f"# {name}: {workload.spec.num_samples:,} samples in {len(workload.shards)} shards, "
            f"{workload.total_bytes / 1e6:,.0f} MB, generated in "
            f"{workload.generation_seconds:.1f} s",
            flush=True,
        )
        results.extend(measure_workload(workload, args.limit, processes))
    print(f"\n{machine_summary()}\n")
    print_markdown_table(RESULT_HEADERS, [result_row(result) for result in results])


if __name__ == "__main__":
    main()
