"""Metadata is cross-checked, not trusted: counts against the tar index, damaged index and info
files named, shards listed twice refused, excludes that match nothing warned about."""

from __future__ import annotations

import json
import random
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest

from energon import WorkerConfig, get_loader, get_val_dataset
from energon.errors import DatasetInfoError, SplitConfigError, TarIndexError
from energon.format.tar_index import tar_index_path
from energon.source.shard_reader import reset_shard_reader
from tests.helpers.datasets import make_text_dataset


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    return make_text_dataset(tmp_path_factory.mktemp("meta"), num_samples=40, num_shards=2)


@pytest.fixture
def ds(pristine, tmp_path) -> Path:
    return Path(shutil.copytree(pristine, tmp_path / "ds"))


def shards_of(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*.tar"))


def load_keys(root: Path, workers: int = 0) -> list[str]:
    reset_shard_reader()
    wc = WorkerConfig(rank=0, world_size=1, num_workers=workers)
    dataset = get_val_dataset(root, split_part="train", worker_config=wc, batch_size=None)
    return [s.__key__ for s in get_loader(dataset)]


def edit_info(root: Path, change) -> None:
    path = root / ".nv-meta" / ".info.json"
    info = json.loads(path.read_text())
    change(info["shard_counts"])
    path.write_text(json.dumps(info))


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("delta", [-3, 2])
def test_info_counts_that_disagree_with_the_tar_index_are_an_error_naming_the_shard(
    ds, workers, delta
):
    shard = shards_of(ds)[1]
    edit_info(ds, lambda counts: counts.__setitem__(shard, counts[shard] + delta))
    with pytest.raises(
        Exception,
        match=rf"{shard}\.idx: the tar index has 20 samples, but .*\.info\.json says the shard has {20 + delta}",
    ) as raised:
        load_keys(ds, workers)
    assert "TarIndexError" in repr(raised.value) or isinstance(raised.value, TarIndexError)


@pytest.mark.parametrize("seed", range(3))
def test_a_damaged_tar_index_is_an_error_naming_the_file(ds, seed):
    rng = np.random.default_rng(seed)
    shard = shards_of(ds)[seed % 2]
    index = ds / tar_index_path(shard)
    size = index.stat().st_size
    index.write_bytes(rng.integers(0, 2**63, size // 8, dtype=np.uint64).tobytes())
    with pytest.raises(TarIndexError, match=rf"{index}: damaged tar index"):
        load_keys(ds)


def test_an_index_that_points_past_the_end_is_a_located_sample_error(ds, capsys):
    """Offsets in order but too large (a flipped high bit in the last entry): no giant read."""
    shard = shards_of(ds)[0]
    index = ds / tar_index_path(shard)
    offsets = np.frombuffer(index.read_bytes(), dtype="<u8").copy()
    offsets[-1] |= 1 << 60
    index.write_bytes(offsets.tobytes())
    keys = load_keys(ds)
    assert len(keys) == 39
    assert "TruncatedShardError" in capsys.readouterr().err


@pytest.mark.parametrize(
    "content",
    [b"{not json", b"\xff\xfe garbage", b"[1, 2, 3]", b'{"shard_counts": {"a.tar": -4}}'],
)
def test_a_garbage_info_json_names_its_path(ds, content):
    path = ds / ".nv-meta" / ".info.json"
    path.write_bytes(content)
    with pytest.raises(DatasetInfoError, match=rf"{path}: "):
        load_keys(ds)


def test_a_shard_listed_twice_in_a_split_is_an_error(ds):
    path = ds / ".nv-meta" / "split.yaml"
    shards = shards_of(ds)
    path.write_text(
        "split_parts:\n  train:\n"
        + "".join(f"  - {s}\n" for s in [*shards, shards[0]])
        + "exclude: []\n"
    )
    with pytest.raises(
        SplitConfigError, match=rf"{path}: split 'train' lists shard '{shards[0]}' more than once"
    ):
        load_keys(ds)
    path.write_text("split_parts: [unclosed\n")
    with pytest.raises(SplitConfigError, match=rf"{path}: not valid YAML"):
        load_keys(ds)


def test_excludes_that_match_nothing_warn(ds):
    path = ds / ".nv-meta" / "split.yaml"
    shards = shards_of(ds)
    first_key = load_keys(ds)[0]
    path.write_text(
        "split_parts:\n  train:\n"
        + "".join(f"  - {s}\n" for s in shards)
        + "exclude:\n"
        + f"  - {shards[0]}/{first_key}\n"  # matches: excluded, no warning
        + "  - parts/typo-00000.tar\n"
        + f"  - {shards[1]}/no-such-key\n"
        + "  - parts/typo-00001.tar/some-key\n"
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        keys = load_keys(ds)
    assert len(keys) == 39 and first_key not in keys
    messages = [str(w.message) for w in caught if "matches nothing" in str(w.message)]
    assert len(messages) == 3
    assert any("'parts/typo-00000.tar'" in m for m in messages)
    assert any(f"'{shards[1]}/no-such-key'" in m for m in messages)
    assert any("'parts/typo-00001.tar/some-key'" in m for m in messages)
    assert all(str(path) in m for m in messages)


def test_damaged_index_bytes_never_become_memory_or_os_errors(ds):
    """Seeded byte flips in a .tar.idx: always a TarIndexError or a located sample error."""
    shard = shards_of(ds)[0]
    index = ds / tar_index_path(shard)
    pristine = index.read_bytes()
    all_keys = load_keys(ds)
    rng = random.Random(5)
    for _ in range(12):
        data = bytearray(pristine)
        pos = rng.randrange(len(data))
        data[pos] ^= 1 << rng.randrange(8)
        index.write_bytes(bytes(data))
        try:
            keys = load_keys(ds)
        except TarIndexError as e:
            assert str(index) in str(e)
        else:  # the damaged sample(s) are skipped; only a larger end offset reads the same
            assert set(keys) <= set(all_keys)
            assert len(keys) < 40 or pos >= len(pristine) - 8
