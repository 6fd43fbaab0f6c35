"""Data damaged after a good prepare: every unreadable sample is skipped, counted and located (shard,
key, byte offset), the rest still loads, with 0 and 2 workers; ``energon lint`` lists them all; with
``prepare --checksums`` payload changes and swapped shards are found too."""

from __future__ import annotations

import os
import random
import shutil
import tarfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from energon import WorkerConfig, get_loader, get_val_dataset
from energon.cli.main import cli
from energon.errors import DamagedSampleError, TruncatedShardError
from energon.format.tar_index import TarIndex, tar_index_path
from energon.prepare.dataset import prepare_dataset
from energon.source.shard_reader import reset_shard_reader
from tests.helpers.datasets import make_text_dataset
from tests.helpers.ref_venv import ref_python, run_script  # noqa: F401 - ref_python is a fixture

TRIALS = 4  # seeded damage patterns per test (bounded, no timing)


class FailureLog:
    """A global_error_handler that works from worker processes: one line per skipped sample."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __call__(self, exc: BaseException, sample=None, sources=None) -> None:
        key = getattr(exc, "key", None)
        where = f"{getattr(exc, 'path', '')}|{getattr(exc, 'offset', '')}|{key}"
        with open(self.path, "a") as f:
            f.write(f"{type(exc).__name__}|{where}\n")

    def read(self) -> list[list[str]]:
        if not self.path.exists():
            return []
        return [line.rstrip("\n").split("|") for line in self.path.read_text().splitlines()]


def load_texts(root: Path, workers: int, log: FailureLog) -> dict[str, str]:
    reset_shard_reader()
    wc = WorkerConfig(rank=0, world_size=1, num_workers=workers, global_error_handler=log)
    dataset = get_val_dataset(root, split_part="train", worker_config=wc, batch_size=None)
    return {s.__key__: s.text for s in get_loader(dataset)}


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    return make_text_dataset(tmp_path_factory.mktemp("pristine"), num_samples=60, num_shards=3)


@pytest.fixture(scope="module")
def pristine_texts(pristine) -> dict[str, str]:
    return load_texts(pristine, 0, FailureLog(pristine / "unused.log"))


def sample_layout(root: Path) -> list[tuple[str, str, int, int, list[int]]]:
    """(shard, key, start, end, member header offsets) of every sample."""
    layout = []
    for shard in sorted(p.relative_to(root).as_posix() for p in root.rglob("*.tar")):
        offsets = TarIndex(root / tar_index_path(shard)).offsets.tolist()
        with tarfile.open(root / shard) as tf:
            headers = [m.offset for m in tf.getmembers()]
            names = [m.name for m in tf.getmembers()]
        for start, end in zip(offsets[:-1], offsets[1:]):
            inside = [h for h in headers if start <= h < end]
            key = names[headers.index(inside[0])].split(".", 1)[0].rsplit("/", 1)[-1]
            layout.append((shard, key, start, end, inside))
    return layout


def copy_dataset(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def flip(path: Path, offset: int, bit: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ (1 << bit)]))


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("trial", range(TRIALS))
def test_header_flips_and_truncation_skip_exactly_the_damaged_samples(
    pristine, pristine_texts, tmp_path, workers, trial
):
    rng = random.Random(1000 + trial)
    root = copy_dataset(pristine, tmp_path / "ds")
    layout = sample_layout(root)
    damaged: dict[str, tuple[str, int]] = {}  # key -> (shard, start)
    for shard, key, start, _end, headers in rng.sample(layout, 3):
        header = rng.choice(headers)
        flip(root / shard, header + rng.randrange(0, 148), rng.randrange(8))  # name..mtime fields
        damaged[key] = (shard, start)
    shards = sorted({entry[0] for entry in layout})
    cut = rng.choice(shards)
    in_cut = [entry for entry in layout if entry[0] == cut]
    first_lost = rng.randrange(1, len(in_cut))
    with open(root / cut, "r+b") as f:  # keeps samples before `first_lost`, cuts into that one
        f.truncate(in_cut[first_lost][2] + rng.randrange(1, 512))
    for shard, key, start, _end, _headers in in_cut[first_lost:]:
        damaged[key] = (shard, start)

    log = FailureLog(tmp_path / "failures.log")
    texts = load_texts(root, workers, log)
    assert texts == {k: v for k, v in pristine_texts.items() if k not in damaged}
    failures = log.read()
    assert len(failures) == len(damaged)
    located = {key: (path, int(offset)) for _, path, offset, key in failures}
    assert located == {key: (str(root / shard), start) for key, (shard, start) in damaged.items()}
    kinds = {kind for kind, *_ in failures}
    assert kinds <= {"DamagedSampleError", "TruncatedShardError"}
    assert "TruncatedShardError" in kinds


def test_lint_lists_every_damaged_sample_and_shard(pristine, tmp_path):
    root = copy_dataset(pristine, tmp_path / "ds")
    layout = sample_layout(root)
    shards = sorted({entry[0] for entry in layout})
    first = [entry for entry in layout if entry[0] == shards[0]]
    flip(root / shards[0], first[2][4][0] + 3, 1)  # a header of sample 2
    flip(root / shards[0], first[5][4][0] + 100, 6)  # and of sample 5
    (root / tar_index_path(shards[1])).write_bytes(b"\xff" * 8 * 21)  # damaged index
    os.unlink(root / shards[2])  # a shard that is gone
    for parallel in ("1", "2"):
        reset_shard_reader()
        result = CliRunner().invoke(cli, ["lint", str(root), "--parallel", parallel])
        assert result.exit_code == 1, result.output
        assert result.exception is None or isinstance(result.exception, SystemExit)
        lines = result.output.splitlines()
        failed = [line for line in lines if line.startswith("FAILED")]
        assert len(failed) == 2  # the two damaged headers
        assert any(f"'{first[2][1]}' at byte offset {first[2][2]}" in line for line in failed)
        assert any(f"'{first[5][1]}' at byte offset {first[5][2]}" in line for line in failed)
        bad = [line for line in lines if line.startswith("BAD SHARD")]
        assert len(bad) == 2
        assert shards[1] in bad[0] and "damaged tar index" in bad[0]
        assert shards[2] in bad[1] and "does not exist" in bad[1]
        assert "train: 18 samples loaded, 42 failed" in result.output


# ---------------------------------------------------------------------------------------------
# Checksums


@pytest.fixture(scope="module")
def checked(tmp_path_factory) -> Path:
    root = make_text_dataset(tmp_path_factory.mktemp("checked"), num_samples=60, num_shards=3)
    prepare_dataset(root, split_parts_ratio=[("train", 1.0)], progress=False, checksums=True)
    return root


@pytest.mark.parametrize("workers", [0, 2])
def test_checksums_catch_every_payload_flip(checked, pristine_texts, tmp_path, workers):
    """Without checksums many payload flips deliver wrong text silently; with them, none does."""
    rng = random.Random(7)
    root = copy_dataset(checked, tmp_path / "ds")
    plain = copy_dataset(checked, tmp_path / "plain")
    shutil.rmtree(plain / ".nv-meta" / "checksums")
    layout = sample_layout(root)
    flipped: dict[str, tuple[str, int]] = {}
    for shard, key, start, _end, headers in rng.sample(layout, 12):
        with tarfile.open(root / shard) as tf:
            member = next(m for m in tf.getmembers() if m.offset == headers[0])
        where = member.offset_data + rng.randrange(member.size)
        bit = rng.randrange(7)  # keep ASCII ASCII: the text still decodes
        flip(root / shard, where, bit)
        flip(plain / shard, where, bit)
        flipped[key] = (shard, start)

    silently_wrong = load_texts(plain, workers, FailureLog(tmp_path / "plain.log"))
    assert sum(silently_wrong[k] != pristine_texts[k] for k in flipped) == len(flipped)

    log = FailureLog(tmp_path / "failures.log")
    texts = load_texts(root, workers, log)
    assert texts == {k: v for k, v in pristine_texts.items() if k not in flipped}
    located = {key: (kind, path, int(offset)) for kind, path, offset, key in log.read()}
    assert located == {
        key: ("DamagedSampleError", str(root / shard), start)
        for key, (shard, start) in flipped.items()
    }


def test_checksums_catch_shards_swapped_or_regenerated_with_the_same_layout(checked, tmp_path):
    root = copy_dataset(checked, tmp_path / "ds")
    shards = sorted(p.relative_to(root).as_posix() for p in root.rglob("*.tar"))
    # a regenerated shard: same keys and sizes, other bytes (every text reversed)
    with tarfile.open(root / shards[0]) as tf:
        members = [(m, tf.extractfile(m).read()) for m in tf.getmembers()]
    with tarfile.open(root / shards[0], "w", format=tarfile.GNU_FORMAT) as tf:
        for member, data in members:
            tf.addfile(member, __import__("io").BytesIO(data[::-1]))
    assert [e[2:4] for e in sample_layout(root) if e[0] == shards[0]] == [
        e[2:4] for e in sample_layout(checked) if e[0] == shards[0]
    ]
    log = FailureLog(tmp_path / "failures.log")
    texts = load_texts(root, 0, log)
    assert len(texts) == 40 and len(log.read()) == 20
    assert all("checksum" not in v for v in texts.values())
    reset_shard_reader()
    result = CliRunner().invoke(cli, ["lint", str(root), "--verify"])
    assert result.exit_code == 1
    assert result.output.count("checksum mismatch") == 20


def test_lint_verify_needs_checksums_and_passes_on_intact_data(checked, pristine):
    reset_shard_reader()
    ok = CliRunner().invoke(cli, ["lint", str(checked), "--verify"])
    assert ok.exit_code == 0, ok.output
    assert "train: 60 samples loaded, 0 failed" in ok.output
    missing = CliRunner().invoke(cli, ["lint", str(pristine), "--verify"])
    assert missing.exit_code == 1 and "prepare --checksums" in missing.output


def test_prepare_without_checksums_removes_stale_ones(checked, tmp_path):
    root = copy_dataset(checked, tmp_path / "ds")
    assert (root / ".nv-meta" / "checksums").is_dir()
    prepare_dataset(root, split_parts_ratio=[("train", 1.0)], progress=False)
    assert not (root / ".nv-meta" / "checksums").exists()
    prepare_dataset(root, progress=False, tar_index_only=True, checksums=True)
    assert len(list((root / ".nv-meta" / "checksums").rglob("*.crc32"))) == 3


def test_checksums_of_another_index_are_a_clear_error(checked, tmp_path):
    root = copy_dataset(checked, tmp_path / "ds")
    shard = sorted(p.relative_to(root).as_posix() for p in root.rglob("*.tar"))[0]
    index = root / tar_index_path(shard)
    offsets = TarIndex(index).offsets.copy()
    offsets[-1] += 512  # an index rebuilt since (one more zero block before the end)
    index.write_bytes(offsets.tobytes())
    reset_shard_reader()
    wc = WorkerConfig(rank=0, world_size=1, num_workers=0)
    loader = get_loader(
        get_val_dataset(root, split_part="train", worker_config=wc, batch_size=None)
    )
    with pytest.raises(
        Exception, match=r"checksums/parts/data-00000\.tar\.crc32.*another \.tar\.idx"
    ):
        list(loader)


def test_reference_loads_a_dataset_prepared_with_checksums(checked, ref_python):  # noqa: F811
    program = f"""
from megatron.energon import WorkerConfig, get_loader, get_val_dataset
wc = WorkerConfig(rank=0, world_size=1, num_workers=0)
ds = get_val_dataset({str(checked)!r}, split_part="train", worker_config=wc, batch_size=None)
print(len([s.__key__ for s in get_loader(ds)]))
"""
    assert run_script(ref_python, program).strip().splitlines()[-1] == "60"


def test_errors_keep_their_location_across_processes():
    import pickle

    for cls in (DamagedSampleError, TruncatedShardError):
        e = pickle.loads(pickle.dumps(cls("/x/a.tar", 1536, "bad", "k1")))
        assert (type(e), e.path, e.offset, e.key) == (cls, "/x/a.tar", 1536, "k1")
        assert str(e) == "/x/a.tar sample 'k1' at byte offset 1536: bad"
