"""Clip extraction from the av demo set: energon's loader vs decoding with PyAV directly.

    python tools/benchmarks/bench_av_clips.py [--workdir bench_data/av_demo] [--repeats 5]
        [--samples 320] [--torchcodec-python PATH] [--write-docs]

The workload is the av demo set (``energon demo-av``: 32 clips of 4 s, 96x64 H.264 at 30 fps,
AAC audio, a keyframe every 15 frames). For every sample a user's task encoder takes three
uniformly spread 0.5 s video clips (``get_clips_uniform``, as docs/av.md shows), concatenates
their frames into one (frames, 3, H, W) uint8 tensor, and the loader batches 4 samples.

The baseline does the same with PyAV directly on the same bytes in the same order: open the
container, seek to each clip's start (keyframe at or before), decode the frames the clip needs,
``to_ndarray("rgb24")``, stack, permute to (frames, 3, H, W), concatenate and batch by 4.

Each measurement runs in a fresh process, energon and baseline alternate, and the median of
``--repeats`` runs is reported: wall clips/s and CPU clips/s (clips per CPU second of all
processes involved, read from /proc/PID/task/*/schedstat, which other jobs on a busy machine do
not inflate). Energon with 0 workers is compared with 1 baseline process, 2 workers with 2.
``--torchcodec-python`` adds torchcodec's ``VideoDecoder`` on the same clips, run by another
interpreter (torchcodec needs its own torch build and FFmpeg libraries).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable

_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _REPO_ROOT not in sys.path:
    sys.path.insert(0, _REPO_ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_common import write_docs_section  # noqa: E402

SECTION = "Audio and video clips"
COMMAND = "python tools/benchmarks/bench_av_clips.py --write-docs"
CLIPS_PER_SAMPLE = 3
CLIP_SECONDS = 0.5
BATCH = 4
WORKLOAD_NOTE = """The av demo set (`energon demo-av`: 32 clips of 4 s, 96x64 H.264 at 30 fps with AAC audio,
a keyframe every 15 frames). Per sample, three uniformly spread 0.5 s video clips
(`get_clips_uniform(video, 0.5, 3, request_video=True)` in a task encoder, frames concatenated,
47 frames per sample), batches of 4, `get_train_dataset` + `get_loader`. The baseline opens each
container with PyAV, seeks to each clip's start, decodes the frames the clip needs,
`frame.to_ndarray(format="rgb24")`, transposes into (frames, 3, H, W) and batches the same samples
in the same order; its outputs are pixel-identical to energon's (tests/av/test_decoder.py checks
clips against a direct PyAV decode on real media). One codec thread everywhere; the 2-process
baseline runs in forked processes with one torch thread each, as torch's DataLoader workers do.
CPU clips/s count the CPU time of every process involved (main and workers), from
/proc/PID/task/*/schedstat: the 2 cores were shared with other jobs (load average 6 to 16
during the recorded run), which inflates wall times (unevenly), not CPU times."""
TORCHCODEC_NOTE = """torchcodec (not adopted): `pip install torch==2.13.0 torchcodec` in a side venv gives
torch 2.13.0+cpu and torchcodec 0.17.0 from PyPI, whose manylinux wheel is a CUDA build:
its libraries need `libnvrtc.so.13`, `libcudart.so.13`, `libc10_cuda.so` and `libtorch_cuda.so`
(`readelf -d .../torchcodec/libtorchcodec_core5.so`; 0.16.0 is the same), so
`import torchcodec` fails with `OSError: Could not load this library: .../libtorchcodec_image.so`
(`libnvrtc.so.13: cannot open shared object file`), even after `apt-get install libavcodec59
libavformat59 libavutil57 libswscale6 libswresample4 libavdevice59 libavfilter8` (Debian 12's
FFmpeg 5.1, which torchcodec's `core5` library is built against). CPU builds are published only
on download.pytorch.org, which this machine cannot reach. Making it load would mean installing
CUDA runtime libraries, which the goal rules out, so it was not measured. To compare where a CPU
build installs: `--torchcodec-python PATH/TO/venv/bin/python`."""


# ---------------------------------------------------------------------------------------------
# CPU time of a process tree (busy machine: wall time is noisy, CPU time is not)


def _process_cpu_ns(pid: int) -> int:
    """CPU nanoseconds of all threads of ``pid`` (0 if it is gone)."""
    total = 0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return 0
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            pass
    return total


def _children(pid: int) -> list[int]:
    found = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return found
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                found += [int(p) for p in f.read().split()]
        except FileNotFoundError:
            pass
    return found


def tree_cpu_ns(pids: set[int]) -> int:
    return sum(_process_cpu_ns(pid) for pid in pids)


def tree_pids() -> set[int]:
    pids, todo = set(), [os.getpid()]
    while todo:
        pid = todo.pop()
        pids.add(pid)
        todo += _children(pid)
    return pids


# ---------------------------------------------------------------------------------------------
# The demo set


def ensure_demo(workdir: str) -> str:
    root = os.path.abspath(workdir)
    if not os.path.exists(os.path.join(root, ".nv-meta", "dataset.yaml")):
        cmd = [sys.executable, "-m", "energon.cli.main", "demo-av", "--workdir", root]
        subprocess.run(cmd + ["--workers", "0"], check=True, cwd=_REPO_ROOT)
    return root


def read_payloads(root: str) -> dict[str, bytes]:
    """``{sample key: mp4 bytes}`` of every shard (read once, outside any timing)."""
    payloads = {}
    for dirpath, _, files in os.walk(root):
        for name in sorted(files):
            if name.endswith(".tar"):
                with tarfile.open(os.path.join(dirpath, name)) as tar:
                    for member in tar:
                        if member.name.endswith(".mp4"):
                            key = member.name.rsplit("/", 1)[-1][: -len(".mp4")]
                            payloads[key] = tar.extractfile(member).read()
    return payloads


def sample_order(root: str, count: int) -> list[str]:
    """The keys the energon loader yields (0 workers), so the baseline decodes the same clips."""
    from energon import WorkerConfig, get_loader, get_train_dataset

    wc = WorkerConfig(rank=0, world_size=1, num_workers=0)
    dataset = get_train_dataset(
        root,
        worker_config=wc,
        batch_size=None,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
    )
    keys = []
    for sample in get_loader(dataset):
        keys.append(sample.__key__)
        if len(keys) == count:
            return keys
    return keys


# ---------------------------------------------------------------------------------------------
# Energon through the public API


def energon_encoder():
    import torch

    from energon import DefaultTaskEncoder
    from energon.av import get_clips_uniform
    from energon.samples import VidQASample

    class ThreeClips(DefaultTaskEncoder):
        def encode_sample(self, sample: VidQASample) -> VidQASample:
            data = get_clips_uniform(
                sample.video, CLIP_SECONDS, CLIPS_PER_SAMPLE, request_video=True
            )
            frames = torch.cat(data.video_clips)
            return VidQASample.derive_from(sample, video=frames, context=sample.context)

    return ThreeClips()


def run_energon(root: str, workers: int, warmup: int, samples: int) -> dict:
    from energon import WorkerConfig, get_loader, get_train_dataset

    wc = WorkerConfig(rank=0, world_size=1, num_workers=workers)
    dataset = get_train_dataset(
        root,
        worker_config=wc,
        batch_size=BATCH,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
        task_encoder=energon_encoder(),
    )
    seen = 0
    start_wall = start_cpu = start_main = pids = None
    frames = 0
    for batch in get_loader(dataset):
        seen += len(batch.__key__)
        if start_wall is None:
            if seen >= warmup:
                pids = tree_pids()
                start_main = _process_cpu_ns(os.getpid())
                start_cpu, start_wall = tree_cpu_ns(pids), time.perf_counter()
                seen = 0
            continue
        frames += batch.video.shape[0] * batch.video.shape[1]
        if seen >= samples:
            break
    wall = time.perf_counter() - start_wall
    cpu = (tree_cpu_ns(pids) - start_cpu) / 1e9
    main_cpu = (_process_cpu_ns(os.getpid()) - start_main) / 1e9
    return {"samples": seen, "wall": wall, "cpu": cpu, "main_cpu": main_cpu, "frames": frames}


# ---------------------------------------------------------------------------------------------
# The direct PyAV baseline


def pyav_clips(data: bytes, shared_reformatter: bool = False):
    """Three uniform 0.5 s clips decoded with PyAV: (frames, 3, H, W) uint8, clips concatenated.

    The same rule as energon: a clip holds the frame showing at its start plus every frame that
    starts up to its end; one codec thread (as energon's default). Frames are converted with
    ``frame.to_ndarray(format="rgb24")`` (PyAV's documented way), or with one
    ``VideoReformatter`` for all frames if ``shared_reformatter`` (what energon does).
    """
    import av
    from av.video.reformatter import VideoReformatter

    reformatter = VideoReformatter() if shared_reformatter else None

    def to_rgb(frame):
        if reformatter is None:
            return frame.to_ndarray(format="rgb24")
        return reformatter.reformat(frame, format="rgb24").to_ndarray()

    import numpy as np
    import torch

    container = av.open(io.BytesIO(data), metadata_errors="ignore")
    try:
        stream = container.streams.video[0]
        stream.codec_context.thread_type = "NONE"
        time_base = stream.time_base
        total = float(stream.duration * time_base)
        clips = []
        for start in np.linspace(0.0, max(0.0, total - CLIP_SECONDS), CLIPS_PER_SAMPLE):
            start_pts = float(start) / time_base
            end_pts = (float(start) + CLIP_SECONDS) / time_base
            container.seek(int(start_pts), stream=stream)
            covering, frames = None, []
            for frame in container.decode(stream):
                if frame.pts <= start_pts:
                    covering = frame
                    continue
                if not frames and covering is not None:
                    frames.append(to_rgb(covering))
                if frame.pts > end_pts:
                    break
                frames.append(to_rgb(frame))
            clip = np.empty((len(frames), 3, *frames[0].shape[:2]), dtype=np.uint8)
            for i, array in enumerate(frames):  # one transposing copy per frame
                clip[i] = array.transpose(2, 0, 1)
            clips.append(torch.from_numpy(clip))
        return torch.cat(clips)
    finally:
        container.close()


def torchcodec_clips(data: bytes):
    """The same clips with torchcodec's ``VideoDecoder`` (exact seeking, frames by index)."""
    import math

    import numpy as np
    import torch
    from torchcodec.decoders import VideoDecoder

    decoder = VideoDecoder(data, seek_mode="exact", num_ffmpeg_threads=1)
    meta = decoder.metadata
    total = float(meta.duration_seconds)
    fps = float(meta.average_fps)
    clips = []
    for start in np.linspace(0.0, max(0.0, total - CLIP_SECONDS), CLIPS_PER_SAMPLE):
        end = float(start) + CLIP_SECONDS
        first = int(math.floor(float(start) * fps + 1e-9))
        last = min(meta.num_frames - 1, int(math.floor(end * fps + 1e-9)))
        clips.append(decoder.get_frames_in_range(first, last + 1).data)
    return torch.cat(clips)


def _decode_loop(decode: Callable, payloads: dict[str, bytes], keys: list[str], warmup: int):
    import torch

    for key in keys[:warmup]:
        decode(payloads[key])
    start_cpu, start_wall = _process_cpu_ns(os.getpid()), time.perf_counter()
    frames = 0
    timed = keys[warmup:]
    for i in range(0, len(timed), BATCH):
        batch = torch.stack([decode(payloads[key]) for key in timed[i : i + BATCH]])
        frames += batch.shape[0] * batch.shape[1]
    return {
        "samples": len(timed),
        "wall": time.perf_counter() - start_wall,
        "cpu": (_process_cpu_ns(os.getpid()) - start_cpu) / 1e9,
        "frames": frames,
    }


def run_direct(
    decode: Callable, root: str, processes: int, warmup: int, samples: int, order: list[str]
) -> dict:
    """``processes`` forked processes, each decoding its share of ``order``; wall time from the
    common start until the last one is done, CPU time summed."""
    payloads = read_payloads(root)
    keys = order[: warmup + samples]
    if processes == 1:
        return _decode_loop(decode, payloads, keys, warmup)
    import multiprocessing as mp

    context = mp.get_context("fork")
    start = context.Barrier(processes + 1)
    queue = context.Queue()

    def child(rank: int) -> None:
        import torch

        torch.set_num_threads(1)  # as torch's DataLoader does in its workers
        mine = keys[rank::processes]
        for key in mine[: warmup // processes]:
            decode(payloads[key])
        start.wait()
        queue.put(_decode_loop(decode, payloads, mine[warmup // processes :], 0))

    children = [context.Process(target=child, args=(r,)) for r in range(processes)]
    for c in children:
        c.start()
    start.wait()
    begin = time.perf_counter()
    results = [queue.get() for _ in children]
    wall = time.perf_counter() - begin
    for c in children:
        c.join()
    return {
        "samples": sum(r["samples"] for r in results),
        "wall": wall,
        "cpu": sum(r["cpu"] for r in results),
        "frames": sum(r["frames"] for r in results),
    }


# ---------------------------------------------------------------------------------------------
# One measurement per fresh process


def measure_once(kind: str, root: str, procs: int, warmup: int, samples: int, order: str) -> dict:
    if kind == "energon":
        return run_energon(root, procs, warmup, samples)
    keys = json.loads(order)
    decode = {
        "pyav": pyav_clips,
        "pyav-reformatter": lambda data: pyav_clips(data, shared_reformatter=True),
        "torchcodec": torchcodec_clips,
    }[kind]
    return run_direct(decode, root, procs, warmup, samples, keys)


def spawn(
    python: str, kind: str, root: str, procs: int, args, order_file: str, threads: str
) -> dict:
    cmd = [python, os.path.abspath(__file__), "--one", kind, "--procs", str(procs)]
    cmd += ["--torch-threads", threads]
    cmd += ["--workdir", root, "--warmup", str(args.warmup), "--samples", str(args.samples)]
    cmd += ["--order-file", order_file]
    env = dict(os.environ, PYTHONPATH=_REPO_ROOT)
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env, cwd=_REPO_ROOT)
    return json.loads(out.stdout.strip().splitlines()[-1])


def rates(result: dict) -> tuple[float, float]:
    clips = result["samples"] * CLIPS_PER_SAMPLE
    return clips / result["wall"], clips / result["cpu"]


def summarize(results: dict, threads: str, torchcodec: bool) -> str:
    """One table (medians) for one torch thread setting of the main processes."""

    def median(kind: str, procs: int) -> tuple[float, float]:
        runs = results[(kind, procs)]
        return statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)

    rows = []
    for workers, procs in ((0, 1), (2, 2)):
        ew, ec = median("energon", workers)
        pw, pc = median("pyav", procs)
        rows.append([f"energon loader, {workers} workers", f"{ew:.0f}", f"{ec:.0f}", "", ""])
        rows.append([f"PyAV direct, {procs} process(es)", f"{pw:.0f}", f"{pc:.0f}", "", ""])
        rows[-2][3:] = [f"{ew / pw:.2f}", f"{ec / pc:.2f}"]
    pw, pc = median("pyav", 1)
    extra = [("pyav-reformatter", "PyAV direct, shared VideoReformatter, 1 process")]
    if torchcodec:
        extra.append(("torchcodec", "torchcodec direct, 1 process"))
    for kind, label in extra:
        w, c = median(kind, 1)
        rows.append(
            [label, f"{w:.0f}", f"{c:.0f}", f"{w / pw:.2f} (vs PyAV)", f"{c / pc:.2f} (vs PyAV)"]
        )
    table = markdown_table(
        ["what", "clips/s (wall)", "clips/s per CPU s", "ratio (wall)", "ratio (CPU)"], rows
    )
    e0w, e0c = median("energon", 0)
    rw, rc = median("pyav-reformatter", 1)
    title = (
        "torch's default intra-op threads in the main processes"
        if threads == "default"
        else f"`torch.set_num_threads({threads})` in every process"
    )
    return (
        f"### {title}\n\n{table}\n\n"
        f"Against direct PyAV with the same shared reformatter (1 process), energon with 0 "
        f"workers reaches {e0w / rw:.2f} (wall) and {e0c / rc:.2f} (CPU)."
    )


def markdown_table(headers: list[str], rows: list[list[object]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workdir", default=os.path.join("bench_data", "av_demo"))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=32)
    parser.add_argument("--samples", type=int, default=320)
    parser.add_argument("--torchcodec-python", default=None)
    parser.add_argument(
        "--torch-threads",
        default="default,1",
        help="comma-separated torch intra-op thread settings, one table each ('default': as is)",
    )
    parser.add_argument("--write-docs", action="store_true")
    parser.add_argument(
        "--one",
        choices=["energon", "pyav", "pyav-reformatter", "torchcodec"],
        help=argparse.SUPPRESS,
    )
    parser.add_argument("--procs", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--order-file", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        with open(args.order_file) as f:
            order = f.read()
        if args.torch_threads != "default":
            import torch

            torch.set_num_threads(int(args.torch_threads))
        result = measure_once(args.one, args.workdir, args.procs, args.warmup, args.samples, order)
        print(json.dumps(result))
        return

    root = ensure_demo(args.workdir)
    order_file = os.path.join(root, "bench_order.json")
    with open(order_file, "w") as f:
        json.dump(sample_order(root, args.warmup + args.samples), f)
    configs = [("energon", 0, sys.executable), ("pyav", 1, sys.executable)]
    configs += [("energon", 2, sys.executable), ("pyav", 2, sys.executable)]
    configs += [("pyav-reformatter", 1, sys.executable)]
    if args.torchcodec_python:
        configs += [("torchcodec", 1, args.torchcodec_python)]
    parts = [
        f"Command: `{COMMAND}` (median of {args.repeats} alternating runs, each in a fresh "
        f"process; {args.samples} samples = {args.samples * CLIPS_PER_SAMPLE} clips timed after "
        f"{args.warmup} warm-up samples).\n\n{WORKLOAD_NOTE}"
    ]
    for threads in args.torch_threads.split(","):
        results: dict[tuple[str, int], list[tuple[float, float]]] = {}
        for repeat in range(args.repeats):
            for kind, procs, python in configs:
                result = spawn(python, kind, root, procs, args, order_file, threads)
                results.setdefault((kind, procs), []).append(rates(result))
                print(f"run {repeat} threads {threads}: {kind} x{procs}: {result}", file=sys.stderr)
        parts.append(summarize(results, threads, args.torchcodec_python is not None))
    parts.append(TORCHCODEC_NOTE)
    text = "\n\n".join(parts) + "\n"
    print(text)
    if args.write_docs:
        write_docs_section(SECTION, text)


if __name__ == "__main__":
    main()
