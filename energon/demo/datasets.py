"""Synthetic WebDataset shards for the demo, the tests and the benchmarks.

Two kinds of datasets are generated:

* captioning: ``<key>.jpg`` (a real JPEG encoded by Pillow) + ``<key>.txt`` (a short caption),
* text: ``<key>.txt`` only (a few hundred to a few thousand characters).

Design choices, and why:

* Every shard draws from its own generator seeded by ``(seed, shard index)``, so the output is
  byte-identical for a seed no matter how many processes write it, and shards are independent
  units of work that parallelise over processes.
* Image sizes come from a separate generator from the pixel content, so
  :func:`planned_image_sizes` can tell the expected sizes without rendering anything (tests use it).
* Images are smooth multi-colour gradients blended with low-resolution noise plus a few flat
  shapes: they compress and decode like photos (tens of KiB at quality 90), not like flat colour
  (which would make decode benchmarks meaninglessly fast), and cost a few milliseconds to make.
* Tar headers carry fixed metadata (mtime 0, uid/gid 0, no user names) so tars are reproducible.
* Shards are written to a temporary name and renamed, so an interrupted run never leaves a
  truncated shard that looks complete.

This module deliberately depends on nothing else in energon, so it can be used to create test
data for the very code it is testing.
"""

from __future__ import annotations

import io
import multiprocessing
import os
import sys
import tarfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
from PIL import Image, ImageDraw

from energon import atomic

__all__ = [
    "planned_image_sizes",
    "render_photo_like_jpeg",
    "sample_key",
    "shard_name",
    "shard_sample_counts",
    "write_captioning_shards",
    "write_text_shards",
]

# A small vocabulary; a few non-ASCII words make UTF-8 decoding do real work.
_VOCABULARY: tuple[str, ...] = tuple(
    (
        "a an the of on in under over near with without and or but small large red green blue "
        "yellow black white old new quiet busy bright dark wooden metal glass stone river mountain "
        "city street house garden window door table chair cat dog bird horse child woman man "
        "tree flower cloud sky sun moon boat car train bicycle road bridge market kitchen book "
        "lamp cup plate bread apple coffee morning evening night summer winter rain snow light "
        "shadow sits stands walks runs flies looks holds carries near behind beside above below "
        "café naïve über façade jalapeño smörgåsbord crème brûlée"
    ).split()
)

# Mean length of a vocabulary word plus its separating space, used to size text corpora.
_MEAN_WORD_CHARS = sum(len(word) + 1 for word in _VOCABULARY) / len(_VOCABULARY)

# Stream ids mixed into the per-shard seed so sizes and content use independent generators.
_SIZE_STREAM = 0
_CONTENT_STREAM = 1

_Job = TypeVar("_Job")


# ----------------------------------------------------------------------------------------------
# Naming and planning (shared by writers, tests and benchmarks)
# ----------------------------------------------------------------------------------------------


def shard_name(shard_index: int) -> str:
    """Relative path of a shard; the same layout the prepare step and benchmarks expect."""
    return f"parts/data-{shard_index:05d}.tar"


def sample_key(shard_index: int, sample_index: int) -> str:
    """Globally unique, dot-free sample key (a dot would split the key from the part name)."""
    return f"{shard_index:05d}_{sample_index:06d}"


def shard_sample_counts(num_samples: int, num_shards: int) -> list[int]:
    """Spread samples as evenly as possible; earlier shards get the remainder.

    Raises ValueError for empty shards, which would only make downstream tools trip.
    """
    if num_shards < 1:
        raise ValueError(f"num_shards must be >= 1, got {num_shards}")
    if num_samples < num_shards:
        raise ValueError(f"num_samples ({num_samples}) must be >= num_shards ({num_shards})")
    base, remainder = divmod(num_samples, num_shards)
    return [base + (1 if shard < remainder else 0) for shard in range(num_shards)]


def _shard_rng(seed: int, shard_index: int, stream: int) -> np.random.Generator:
    """Independent generator per (seed, shard, stream): reproducible regardless of scheduling."""
    return np.random.default_rng([seed, shard_index, stream])


def _draw_image_sizes(
    seed: int, shard_index: int, count: int, min_size: int, max_size: int
) -> list[tuple[int, int]]:
    """(width, height) per sample of a shard, each uniform in [min_size, max_size]."""
    sizes = _shard_rng(seed, shard_index, _SIZE_STREAM).integers(
        min_size, max_size + 1, size=(count, 2)
    )
    return [(int(width), int(height)) for width, height in sizes]


def planned_image_sizes(
    *, num_samples: int, num_shards: int, min_size: int = 256, max_size: int = 640, seed: int = 0
) -> dict[str, tuple[int, int]]:
    """Sample key -> (width, height) that :func:`write_captioning_shards` produces for these args.

    Lets tests check decoded sizes exactly without trusting the JPEG files themselves.
    """
    _check_size_bounds(min_size, max_size)
    planned: dict[str, tuple[int, int]] = {}
    for shard_index, count in enumerate(shard_sample_counts(num_samples, num_shards)):
        sizes = _draw_image_sizes(seed, shard_index, count, min_size, max_size)
        for sample_index, size in enumerate(sizes):
            planned[sample_key(shard_index, sample_index)] = size
    return planned


def _check_size_bounds(min_size: int, max_size: int) -> None:
    if not 1 <= min_size <= max_size:
        raise ValueError(f"need 1 <= min_size <= max_size, got {min_size}, {max_size}")


# ----------------------------------------------------------------------------------------------
# Content
# ----------------------------------------------------------------------------------------------


def _random_colour(rng: np.random.Generator) -> tuple[int, int, int]:
    red, green, blue = rng.integers(0, 256, size=3).tolist()
    return red, green, blue


def _random_box(rng: np.random.Generator, width: int, height: int) -> tuple[int, int, int, int]:
    left, right = sorted(rng.integers(0, width, size=2).tolist())
    top, bottom = sorted(rng.integers(0, height, size=2).tolist())
    return left, top, right, bottom


def render_photo_like_jpeg(
    rng: np.random.Generator, width: int, height: int, quality: int = 90
) -> bytes:
    """A JPEG that costs a few ms to make but decodes and compresses roughly like a photo.

    Built from C-level Pillow operations only (resize, blend, draw): per-pixel numpy arithmetic
    would triple the generation time of the benchmark workloads.
    """
    colour_grid = rng.integers(0, 256, size=(4, 4, 3), dtype=np.uint8)
    gradient = Image.fromarray(colour_grid).resize((width, height), Image.Resampling.BICUBIC)
    coarse_noise = rng.integers(0, 256, size=(height // 3 + 1, width // 3 + 1, 3), dtype=np.uint8)
    texture = Image.fromarray(coarse_noise).resize((width, height), Image.Resampling.BILINEAR)
    image = Image.blend(gradient, texture, 0.3)
    draw = ImageDraw.Draw(image)
    for _ in range(int(rng.integers(2, 8))):
        box = _random_box(rng, width, height)
        if rng.random() < 0.5:
            draw.ellipse(box, fill=_random_colour(rng))
        else:
            draw.rectangle(box, fill=_random_colour(rng))
    encoded = io.BytesIO()
    image.save(encoded, format="JPEG", quality=quality)
    return encoded.getvalue()


def _random_caption(rng: np.random.Generator) -> str:
    word_indices = rng.integers(0, len(_VOCABULARY), size=int(rng.integers(3, 13)))
    return " ".join(_VOCABULARY[index] for index in word_indices.tolist())


def _random_texts(rng: np.random.Generator, lengths: Sequence[int]) -> list[str]:
    """Texts of exactly the given lengths (in characters), cut from one random word stream.

    Drawing the words of a whole shard in one numpy call and slicing is far faster than
    composing every text word by word, which matters for the 420 MB text benchmark workload.
    Texts may start or end mid-word; nothing downstream cares.
    """
    total_chars = int(sum(lengths))
    words = np.asarray(_VOCABULARY, dtype=object)
    pieces: list[str] = []
    produced = 0
    while produced < total_chars:
        word_count = int((total_chars - produced) / _MEAN_WORD_CHARS * 1.1) + 16
        piece = " ".join(words[rng.integers(0, len(words), size=word_count)].tolist()) + " "
        pieces.append(piece)
        produced += len(piece)
    corpus = "".join(pieces)
    texts: list[str] = []
    start = 0
    for length in lengths:
        texts.append(corpus[start : start + length])
        start += length
    return texts


# ----------------------------------------------------------------------------------------------
# Tar writing
# ----------------------------------------------------------------------------------------------


def _add_member(tar: tarfile.TarFile, name: str, payload: bytes) -> None:
    """Add one regular file with fixed metadata, so the archive bytes depend only on content."""
    info = tarfile.TarInfo(name)
    info.size = len(payload)
    info.mtime = 0
    info.mode = 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    tar.addfile(info, io.BytesIO(payload))


def _write_tar_atomically(path: str, members: Iterable[tuple[str, bytes]]) -> None:
    """Write a tar via a temporary file + rename: a crash never leaves a plausible partial shard."""
    with atomic.replacing(path) as temporary_path:
        with tarfile.open(temporary_path, "w", format=tarfile.USTAR_FORMAT) as tar:
            for name, payload in members:
                _add_member(tar, name, payload)


@dataclass(frozen=True)
class _CaptioningShardJob:
    path: str
    shard_index: int
    count: int
    seed: int
    min_size: int
    max_size: int
    quality: int


@dataclass(frozen=True)
class _TextShardJob:
    path: str
    shard_index: int
    count: int
    seed: int
    min_chars: int
    max_chars: int


def _captioning_members(job: _CaptioningShardJob) -> Iterable[tuple[str, bytes]]:
    sizes = _draw_image_sizes(job.seed, job.shard_index, job.count, job.min_size, job.max_size)
    rng = _shard_rng(job.seed, job.shard_index, _CONTENT_STREAM)
    for sample_index, (width, height) in enumerate(sizes):
        key = sample_key(job.shard_index, sample_index)
        yield f"{key}.jpg", render_photo_like_jpeg(rng, width, height, job.quality)
        yield f"{key}.txt", _random_caption(rng).encode("utf-8")


def _text_members(job: _TextShardJob) -> Iterable[tuple[str, bytes]]:
    rng = _shard_rng(job.seed, job.shard_index, _CONTENT_STREAM)
    lengths = rng.integers(job.min_chars, job.max_chars + 1, size=job.count).tolist()
    for sample_index, text in enumerate(_random_texts(rng, lengths)):
        yield f"{sample_key(job.shard_index, sample_index)}.txt", text.encode("utf-8")


def _write_captioning_shard(job: _CaptioningShardJob) -> int:
    _write_tar_atomically(job.path, _captioning_members(job))
    return job.shard_index


def _write_text_shard(job: _TextShardJob) -> int:
    _write_tar_atomically(job.path, _text_members(job))
    return job.shard_index


def _run_jobs(
    write_shard: Callable[[_Job], int],
    jobs: Sequence[_Job],
    *,
    processes: int | None,
    progress: bool,
) -> None:
    """Run shard jobs in a process pool (or inline for one process, which eases debugging)."""
    if processes is None:
        processes = min(os.cpu_count() or 1, len(jobs))
    done = 0

    def report() -> None:
        if progress:
            print(f"\rwrote {done}/{len(jobs)} shards", end="", file=sys.stderr, flush=True)

    if processes <= 1:
        for job in jobs:
            write_shard(job)
            done += 1
            report()
    else:
        with multiprocessing.get_context().Pool(processes) as pool:
            for _ in pool.imap_unordered(write_shard, jobs):
                done += 1
                report()
    if progress:
        print(file=sys.stderr)


def _prepare_output_dir(out_dir: str | os.PathLike[str]) -> str:
    out_dir = os.fspath(out_dir)
    os.makedirs(os.path.join(out_dir, "parts"), exist_ok=True)
    return out_dir


# ----------------------------------------------------------------------------------------------
# Public writers
# ----------------------------------------------------------------------------------------------


def write_captioning_shards(
    out_dir: str | os.PathLike[str],
    *,
    num_samples: int,
    num_shards: int,
    min_size: int = 256,
    max_size: int = 640,
    seed: int = 0,
    quality: int = 90,
    progress: bool = False,
    processes: int | None = None,
) -> list[str]:
    """Write ``parts/data-NNNNN.tar`` shards of ``<key>.jpg`` + ``<key>.txt`` samples.

    Returns the shard paths relative to ``out_dir`` in shard order. ``processes=None`` uses one
    process per core (capped at the shard count); the output does not depend on it.
    """
    _check_size_bounds(min_size, max_size)
    out_dir = _prepare_output_dir(out_dir)
    names = []
    jobs = []
    for shard_index, count in enumerate(shard_sample_counts(num_samples, num_shards)):
        names.append(shard_name(shard_index))
        jobs.append(
            _CaptioningShardJob(
                path=os.path.join(out_dir, names[-1]),
                shard_index=shard_index,
                count=count,
                seed=seed,
                min_size=min_size,
                max_size=max_size,
                quality=quality,
            )
        )
    _run_jobs(_write_captioning_shard, jobs, processes=processes, progress=progress)
    return names


def write_text_shards(
    out_dir: str | os.PathLike[str],
    *,
    num_samples: int,
    num_shards: int,
    min_chars: int = 200,
    max_chars: int = 4000,
    seed: int = 0,
    progress: bool = False,
    processes: int | None = None,
) -> list[str]:
    """Write ``parts/data-NNNNN.tar`` shards of ``<key>.txt`` samples of random words.

    Each text has a length (in characters, not bytes) uniform in [min_chars, max_chars].
    Returns the shard paths relative to ``out_dir`` in shard order.
    """
    if not 0 <= min_chars <= max_chars:
        raise ValueError(f"need 0 <= min_chars <= max_chars, got {min_chars}, {max_chars}")
    out_dir = _prepare_output_dir(out_dir)
    names = []
    jobs = []
    for shard_index, count in enumerate(shard_sample_counts(num_samples, num_shards)):
        names.append(shard_name(shard_index))
        jobs.append(
            _TextShardJob(
                path=os.path.join(out_dir, names[-1]),
                shard_index=shard_index,
                count=count,
                seed=seed,
                min_chars=min_chars,
                max_chars=max_chars,
            )
        )
    _run_jobs(_write_text_shard, jobs, processes=processes, progress=progress)
    return names
