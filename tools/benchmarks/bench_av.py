"""Audio/video decoding benchmark: seeking vs decoding everything, and loader throughput.

    python tools/benchmarks/bench_av.py [--workdir bench_data/av] [--write-docs]

1. Eight uniformly spaced frames of a 60 s, 30 fps video (H.264, 320x240, 1 s keyframe interval)
   with ``get_single_frames_uniform`` vs decoding every frame (``AVDecoder.get_video``) and vs a
   plain PyAV loop converting every frame to RGB (the raw decode baseline).
2. A video-QA workload (``VidQASample``, 8 frames per clip) and an audio workload (two 1 s clips
   per WAV / FLAC file) through ``get_val_dataset`` + ``get_loader`` with 0 and 2 workers, against
   the same decoding in a plain loop over the same bytes (no loader).

Prints markdown tables; ``--write-docs`` replaces the "Audio and video" section of
docs/benchmarks.md (other sections are left alone).
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import time
from collections.abc import Callable

_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _REPO_ROOT not in sys.path:
    sys.path.insert(0, _REPO_ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_common import write_docs_section  # noqa: E402

from energon import DefaultTaskEncoder, WorkerConfig, get_loader, get_val_dataset  # noqa: E402
from energon.av import AVDecoder, get_clips_uniform, get_single_frames_uniform  # noqa: E402
from energon.av._pyav import open_container  # noqa: E402
from energon.demo.av import encode_audio, encode_video, pick_codec, write_tar_shards  # noqa: E402
from energon.prepare.dataset import prepare_dataset  # noqa: E402
from energon.samples import CrudeSample, VidQASample  # noqa: E402

SECTION = "Audio and video"
COMMAND = "python tools/benchmarks/bench_av.py --write-docs"
VIDQA_YAML = """sample_type:
  __module__: megatron.energon
  __class__: VidQASample
field_map:
  video: mp4
  context: txt
"""
CRUDE_YAML = """__module__: megatron.energon
__class__: CrudeWebdataset
"""
H264 = pick_codec("libx264", "h264", "mpeg4")


def best_of(repeats: int, fn: Callable[[], object]) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def markdown_table(headers: list[str], rows: list[list[object]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# 1. seeking


def decode_all_with_pyav(data: bytes) -> int:
    container = open_container(data, 1)
    try:
        return sum(
            1 for frame in container.decode(video=0) if frame.to_ndarray(format="rgb24") is not None
        )
    finally:
        container.close()


def bench_seeking(workdir: str) -> tuple[str, float]:
    path = os.path.join(workdir, "long_60s.mp4")
    if not os.path.exists(path):
        print("encoding a 60 s 320x240 video ...", flush=True)
        data = encode_video(
            video_codec=H264,
            width=320,
            height=240,
            seconds=60,
            gop=30,
            texture_seed=1,
            audio_codec="aac",
        )
        with open(path, "wb") as f:
            f.write(data)
    with open(path, "rb") as f:
        data = f.read()
    uniform = best_of(10, lambda: get_single_frames_uniform(AVDecoder(data), 8))
    whole = best_of(3, lambda: AVDecoder(data).get_video())
    raw = best_of(3, lambda: decode_all_with_pyav(data))
    rows = [
        ["8 uniform frames (`get_single_frames_uniform`)", f"{uniform * 1000:.0f}", "1.0x"],
        ["every frame (`AVDecoder.get_video`)", f"{whole * 1000:.0f}", f"{whole / uniform:.1f}x"],
        [
            "every frame, plain PyAV loop to RGB (baseline)",
            f"{raw * 1000:.0f}",
            f"{raw / uniform:.1f}x",
        ],
    ]
    table = markdown_table(["what", "ms (best of runs)", "time vs 8 frames"], rows)
    return table, whole / uniform


# ---------------------------------------------------------------------------------------------
# 2. loader workloads


class UniformFrames(DefaultTaskEncoder):
    def encode_sample(self, sample: VidQASample) -> VidQASample:
        frames = get_single_frames_uniform(sample.video, 8, video_out_frame_size=(112, 112))
        return VidQASample.derive_from(sample, video=frames, context=sample.context)


class AudioClips(DefaultTaskEncoder):
    def encode_sample(self, sample: CrudeSample) -> VidQASample:
        decoder = sample["wav"] if "wav" in sample else sample["flac"]
        clips = get_clips_uniform(decoder, 1.0, 2, request_audio=True).audio_clips
        return VidQASample(
            __key__=sample["__key__"],
            __restore_key__=sample["__restore_key__"],
            video=clips[0].float(),
            context="",
            answer_weights=clips[1].float(),
        )


def make_vidqa(workdir: str, count: int = 24) -> str:
    root = os.path.join(workdir, "vidqa")
    if not os.path.exists(os.path.join(root, ".nv-meta", "dataset.yaml")):
        print(f"encoding {count} 8 s clips ...", flush=True)
        samples = [
            (
                f"v{i:04d}",
                {
                    "mp4": encode_video(
                        video_codec=H264,
                        width=320,
                        height=240,
                        seconds=8,
                        gop=30,
                        texture_seed=i,
                        audio_codec="aac",
                    ),
                    "txt": b"what happens?",
                },
            )
            for i in range(count)
        ]
        write_tar_shards(root, samples, 4)
        prepare_dataset(root, split_parts_ratio=[("train", 1.0)], progress=False, num_workers=1)
        with open(os.path.join(root, ".nv-meta", "dataset.yaml"), "w") as f:
            f.write(VIDQA_YAML)
    return root


def make_audio(workdir: str, kind: str, count: int = 200) -> str:
    root = os.path.join(workdir, f"audio_{kind}")
    if not os.path.exists(os.path.join(root, ".nv-meta", "dataset.yaml")):
        print(f"encoding {count} 5 s {kind} files ...", flush=True)
        if kind == "wav":
            make = lambda: encode_audio(rate=16000, channels=1, seconds=5)  # noqa: E731
        else:
            make = lambda: encode_audio(container="flac", codec="flac", rate=16000, seconds=5)  # noqa: E731
        one = make()
        samples = [(f"a{i:05d}", {kind: one}) for i in range(count)]
        write_tar_shards(root, samples, 4)
        prepare_dataset(root, split_parts_ratio=[("train", 1.0)], progress=False, num_workers=1)
        with open(os.path.join(root, ".nv-meta", "dataset.yaml"), "w") as f:
            f.write(CRUDE_YAML)
    return root


def loader_rate(root: str, encoder: DefaultTaskEncoder, workers: int) -> float:
    wc = WorkerConfig(rank=0, world_size=1, num_workers=workers)
    dataset = get_val_dataset(
        root, split_part="train", worker_config=wc, batch_size=4, task_encoder=encoder
    )
    start = time.perf_counter()
    count = sum(len(batch.__key__) for batch in get_loader(dataset))
    return count / (time.perf_counter() - start)


def raw_rate(root: str, part: str, work: Callable[[AVDecoder], object]) -> float:
    """The same decoding in a plain loop over the members' bytes (read once, outside the timing)."""
    import tarfile

    payloads = []
    for name in sorted(os.listdir(root)):
        if name.endswith(".tar"):
            with tarfile.open(os.path.join(root, name)) as tar:
                payloads += [tar.extractfile(m).read() for m in tar if m.name.endswith("." + part)]
    start = time.perf_counter()
    for data in payloads:
        work(AVDecoder(data))
    return len(payloads) / (time.perf_counter() - start)


def bench_workloads(workdir: str) -> str:
    rows = []
    vidqa = make_vidqa(workdir)
    frames = lambda d: get_single_frames_uniform(d, 8, video_out_frame_size=(112, 112))  # noqa: E731
    rows.append(
        [
            "video QA: 8 s 320x240 H.264, 8 frames/clip",
            "plain loop (baseline)",
            "-",
            f"{raw_rate(vidqa, 'mp4', frames):.1f}",
        ]
    )
    for workers in (0, 2):
        rows.append(["", "loader", workers, f"{loader_rate(vidqa, UniformFrames(), workers):.1f}"])
    for kind in ("wav", "flac"):
        root = make_audio(workdir, kind)
        clips = lambda d: get_clips_uniform(d, 1.0, 2, request_audio=True)  # noqa: E731
        label = f"audio: 5 s 16 kHz {kind.upper()}, two 1 s clips/file"
        rows.append([label, "plain loop (baseline)", "-", f"{raw_rate(root, kind, clips):.0f}"])
        for workers in (0, 2):
            rows.append(["", "loader", workers, f"{loader_rate(root, AudioClips(), workers):.0f}"])
    return markdown_table(["workload", "how", "workers", "samples/s"], rows)


# ---------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workdir", default=os.path.join("bench_data", "av"))
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    seek_table, speedup = bench_seeking(args.workdir)
    workload_table = bench_workloads(args.workdir)
    out = io.StringIO()
    out.write(
        f"Command: `{COMMAND}`. Machine: 2 shared CPU cores; PyAV with FFmpeg's "
        "software decoders, one codec thread per container.\n\n"
    )
    out.write("### Eight frames of a 60 s video vs decoding all of it\n\n")
    out.write(
        "60 s, 30 fps (1,800 frames), 320x240 H.264 with a moving texture, a keyframe every "
        "second. Seeking decodes only from the keyframe before each wanted frame.\n\n"
    )
    out.write(seek_table + "\n\n")
    out.write(f"Eight uniform frames are {speedup:.0f}x faster than decoding every frame.\n\n")
    out.write("### Throughput through the loader\n\n")
    out.write(
        "24 video clips (4 shards), batch size 4, frames resized to 112x112; 200 audio files "
        "(4 shards). WAV uses the PCM fast path (numpy slicing, no codec). 'plain loop' runs "
        "the same decoding over the same bytes without the loader.\n\n"
    )
    out.write(workload_table + "\n\n")
    out.write(
        "The machine's 2 cores are shared with other jobs: absolute rates vary up to ~2x "
        "between runs; compare rows of one run. Video decoding scales with workers. The "
        "audio samples are tiny (two 1 s clips), so with workers the per-batch transfer "
        "between processes, not decoding, bounds the rate (the WAV fast path decodes "
        ">10,000 files/s in a plain loop).\n"
    )
    text = out.getvalue()
    print(text)
    if args.write_docs:
        write_docs_section(SECTION, text)


if __name__ == "__main__":
    main()
