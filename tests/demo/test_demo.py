"""Tests for energon.demo: the synthetic shards must be valid, unique, exact and reproducible,
because tests and benchmarks elsewhere take them as ground truth."""

from __future__ import annotations

import io
import os
import re
import tarfile
from pathlib import Path

import pytest
from PIL import Image

from energon.demo import (
    planned_image_sizes,
    shard_sample_counts,
    write_captioning_shards,
    write_text_shards,
)

CAPTIONING_ARGS = dict(num_samples=13, num_shards=3, min_size=24, max_size=72)
TEXT_ARGS = dict(num_samples=40, num_shards=3, min_chars=5, max_chars=300)
KEY_RE = re.compile(r"^[0-9]{5}_[0-9]{6}$")


def read_members(tar_path: Path) -> list[tuple[str, bytes]]:
    """(name, payload) of every member, failing on anything that is not a regular file."""
    members = []
    with tarfile.open(tar_path, "r:") as tar:
        for member in tar:
            assert member.isfile(), member.name
            file = tar.extractfile(member)
            assert file is not None
            members.append((member.name, file.read()))
    return members


def samples_by_key(root: Path, shards: list[str]) -> dict[str, dict[str, bytes]]:
    """key -> {extension: payload}; asserts that no member repeats and no key spans shards."""
    samples: dict[str, dict[str, bytes]] = {}
    shard_of_key: dict[str, str] = {}
    for shard in shards:
        for name, payload in read_members(root / shard):
            key, extension = name.split(".", 1)
            assert shard_of_key.setdefault(key, shard) == shard, f"key {key} in two shards"
            parts = samples.setdefault(key, {})
            assert extension not in parts, f"{name} appears twice"
            parts[extension] = payload
    return samples


def shard_bytes(root: Path, shards: list[str]) -> list[bytes]:
    return [(root / shard).read_bytes() for shard in shards]


# ----------------------------------------------------------------------------------------------
# Sample distribution
# ----------------------------------------------------------------------------------------------


def test_shard_sample_counts_spread_evenly() -> None:
    assert shard_sample_counts(10, 3) == [4, 3, 3]
    assert shard_sample_counts(9, 3) == [3, 3, 3]
    assert sum(shard_sample_counts(20_000, 40)) == 20_000


@pytest.mark.parametrize("num_samples,num_shards", [(5, 0), (2, 3)])
def test_shard_sample_counts_reject_empty_shards(num_samples: int, num_shards: int) -> None:
    with pytest.raises(ValueError):
        shard_sample_counts(num_samples, num_shards)


# ----------------------------------------------------------------------------------------------
# Captioning
# ----------------------------------------------------------------------------------------------


def test_captioning_shards_are_valid_tars_with_paired_parts(tmp_path: Path) -> None:
    shards = write_captioning_shards(tmp_path, **CAPTIONING_ARGS, processes=1)

    assert shards == [f"parts/data-{index:05d}.tar" for index in range(3)]
    assert all(not os.path.isabs(shard) for shard in shards)
    samples = samples_by_key(tmp_path, shards)
    assert len(samples) == 13
    for key, parts in samples.items():
        assert KEY_RE.match(key) and "." not in key
        assert set(parts) == {"jpg", "txt"}
    assert not list((tmp_path / "parts").glob("*.tmp*")), "temporary files left behind"


def test_captioning_samples_keep_shard_order(tmp_path: Path) -> None:
    shards = write_captioning_shards(tmp_path, **CAPTIONING_ARGS, processes=1)

    names = [name for name, _ in read_members(tmp_path / shards[0])]
    assert names == sorted(names)
    assert names[:2] == ["00000_000000.jpg", "00000_000000.txt"]


def test_captioning_images_decode_to_planned_sizes(tmp_path: Path) -> None:
    shards = write_captioning_shards(tmp_path, **CAPTIONING_ARGS, processes=1)
    planned = planned_image_sizes(**CAPTIONING_ARGS)

    samples = samples_by_key(tmp_path, shards)
    assert set(samples) == set(planned)
    for key, parts in samples.items():
        with Image.open(io.BytesIO(parts["jpg"])) as image:
            assert image.format == "JPEG"
            image.load()
            assert image.mode == "RGB"
            assert image.size == planned[key]
        width, height = planned[key]
        assert 24 <= width <= 72 and 24 <= height <= 72


def test_captioning_images_are_not_flat(tmp_path: Path) -> None:
    """Flat images would make decode benchmarks meaninglessly fast."""
    shards = write_captioning_shards(tmp_path, num_samples=2, num_shards=1, processes=1)

    for parts in samples_by_key(tmp_path, shards).values():
        with Image.open(io.BytesIO(parts["jpg"])) as image:
            extrema = image.convert("L").getextrema()
        assert extrema[1] - extrema[0] > 50
        assert len(parts["jpg"]) > 5_000


def test_captions_are_short_utf8_sentences(tmp_path: Path) -> None:
    shards = write_captioning_shards(tmp_path, **CAPTIONING_ARGS, processes=1)

    for parts in samples_by_key(tmp_path, shards).values():
        words = parts["txt"].decode("utf-8").split(" ")
        assert 3 <= len(words) <= 12 and all(words)


def test_captioning_is_deterministic_across_process_counts(tmp_path: Path) -> None:
    first = write_captioning_shards(tmp_path / "a", **CAPTIONING_ARGS, seed=7, processes=1)
    second = write_captioning_shards(tmp_path / "b", **CAPTIONING_ARGS, seed=7, processes=2)

    assert shard_bytes(tmp_path / "a", first) == shard_bytes(tmp_path / "b", second)


def test_captioning_differs_for_another_seed(tmp_path: Path) -> None:
    first = write_captioning_shards(tmp_path / "a", **CAPTIONING_ARGS, seed=1, processes=1)
    second = write_captioning_shards(tmp_path / "b", **CAPTIONING_ARGS, seed=2, processes=1)

    for first_bytes, second_bytes in zip(
        shard_bytes(tmp_path / "a", first), shard_bytes(tmp_path / "b", second)
    ):
        assert first_bytes != second_bytes
    assert planned_image_sizes(**CAPTIONING_ARGS, seed=1) != planned_image_sizes(
        **CAPTIONING_ARGS, seed=2
    )


def test_captioning_rejects_bad_size_bounds(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        write_captioning_shards(tmp_path, num_samples=2, num_shards=1, min_size=50, max_size=40)


# ----------------------------------------------------------------------------------------------
# Text
# ----------------------------------------------------------------------------------------------


def test_text_shards_hold_texts_of_bounded_length(tmp_path: Path) -> None:
    shards = write_text_shards(tmp_path, **TEXT_ARGS, processes=1)

    samples = samples_by_key(tmp_path, shards)
    assert len(samples) == 40
    lengths = set()
    for key, parts in samples.items():
        assert KEY_RE.match(key)
        assert set(parts) == {"txt"}
        text = parts["txt"].decode("utf-8")
        assert 5 <= len(text) <= 300
        lengths.add(len(text))
    assert len(lengths) > 10, "lengths should vary"


def test_text_is_deterministic_and_seed_dependent(tmp_path: Path) -> None:
    first = write_text_shards(tmp_path / "a", **TEXT_ARGS, seed=3, processes=1)
    again = write_text_shards(tmp_path / "b", **TEXT_ARGS, seed=3, processes=2)
    other = write_text_shards(tmp_path / "c", **TEXT_ARGS, seed=4, processes=1)

    assert shard_bytes(tmp_path / "a", first) == shard_bytes(tmp_path / "b", again)
    assert shard_bytes(tmp_path / "a", first) != shard_bytes(tmp_path / "c", other)


def test_rewriting_replaces_shards_in_place(tmp_path: Path) -> None:
    """Benchmarks regenerate into an existing directory; that must not append or fail."""
    write_text_shards(tmp_path, **TEXT_ARGS, seed=5, processes=1)
    shards = write_text_shards(tmp_path, **TEXT_ARGS, seed=6, processes=1)
    fresh = write_text_shards(tmp_path / "fresh", **TEXT_ARGS, seed=6, processes=1)

    assert shard_bytes(tmp_path, shards) == shard_bytes(tmp_path / "fresh", fresh)
