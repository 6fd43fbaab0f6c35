"""Bad input gets a clear error naming file, shard, key and offset, and loses nothing silently."""

from __future__ import annotations

import io
import os
import tarfile

import pytest
from PIL import Image

from energon import (
    WorkerConfig,
    get_loader,
    get_train_dataset,
    get_val_dataset,
    reraise_exception,
)
from energon.errors import DatasetNotPreparedError
from energon.prepare.dataset import prepare_dataset
from energon.source.dataset_config import DatasetConfigError
from tests.helpers.datasets import CAPTIONING_YAML


def jpeg_bytes(size=(16, 12)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, (200, 30, 60)).save(buf, format="JPEG")
    return buf.getvalue()


def write_tar(path, members):
    with tarfile.open(path, "w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


@pytest.fixture()
def corrupt_ds(tmp_path):
    members = []
    for i in range(10):
        jpg = b"this is not a jpeg" if i == 4 else jpeg_bytes()
        members += [(f"s{i:03d}.jpg", jpg), (f"s{i:03d}.txt", f"caption {i}".encode())]
    write_tar(tmp_path / "a.tar", members)
    prepare_dataset(tmp_path, split_parts_ratio=[("train", 1.0)], progress=False, num_workers=1)
    (tmp_path / ".nv-meta" / "dataset.yaml").write_text(CAPTIONING_YAML)
    return tmp_path


def val_loader(path, **kwargs):
    wc = WorkerConfig(rank=0, world_size=1, num_workers=0, **kwargs)
    return get_loader(get_val_dataset(path, split_part="train", worker_config=wc, batch_size=None))


def test_undecodable_sample_is_skipped_and_reported(corrupt_ds, capsys):
    keys = [s.__key__ for s in val_loader(corrupt_ds)]
    assert keys == [f"s{i:03d}" for i in range(10) if i != 4]
    err = capsys.readouterr().err
    assert "a.tar" in err and "'s004'" in err and "byte offset" in err


def test_undecodable_sample_raises_with_reraise_policy(corrupt_ds):

    with pytest.raises(Exception, match=r"a\.tar sample 's004'.*byte offset"):
        list(val_loader(corrupt_ds, global_error_handler=reraise_exception))


def test_shard_truncated_after_prepare_skips_and_names_the_lost_samples(corrupt_ds, capsys):
    tar = corrupt_ds / "a.tar"
    size = os.path.getsize(tar)
    with open(tar, "r+b") as f:
        f.truncate(size // 2)
    keys = [s.__key__ for s in val_loader(corrupt_ds)]
    assert keys == ["s000", "s001", "s002", "s003", "s005"]  # s004 is no JPEG; s006.. are cut
    err = capsys.readouterr().err
    assert "TruncatedShardError" in err and "a.tar sample 's009'" in err and "byte offset" in err
    seen = []
    list(val_loader(corrupt_ds, global_error_handler=lambda e, *_: seen.append(e)))
    truncated = [e for e in seen if isinstance(e, OSError)]  # still an OSError for old callers
    assert [e.key for e in truncated] == [f"s{i:03d}" for i in range(6, 10)]
    assert all(e.path.endswith("a.tar") and e.offset > 0 for e in truncated)


def test_wrong_dataset_yaml_names_file_and_key(corrupt_ds):
    (corrupt_ds / ".nv-meta" / "dataset.yaml").write_text(CAPTIONING_YAML + "colour: blue\n")
    with pytest.raises(DatasetConfigError, match=r"dataset\.yaml.*colour"):
        val_loader(corrupt_ds)
    (corrupt_ds / ".nv-meta" / "dataset.yaml").write_text("sample_type: [unclosed\n")
    with pytest.raises(DatasetConfigError, match="invalid YAML"):
        val_loader(corrupt_ds)
    (corrupt_ds / ".nv-meta" / "dataset.yaml").write_text(
        CAPTIONING_YAML.replace("caption: txt", "")
    )
    with pytest.raises(DatasetConfigError, match="caption"):
        val_loader(corrupt_ds)


def test_yaml_cannot_import_arbitrary_modules(corrupt_ds):
    (corrupt_ds / ".nv-meta" / "dataset.yaml").write_text(
        "sample_type:\n  __module__: evil_payload\n  __class__: Popen\nfield_map:\n  image: jpg\n"
    )
    with pytest.raises(ValueError, match="Refusing to import module .evil_payload."):
        val_loader(corrupt_ds)


def test_missing_split_and_unprepared_dataset(corrupt_ds, tmp_path_factory):
    wc = WorkerConfig(rank=0, world_size=1, num_workers=0)
    with pytest.raises(Exception, match="val"):
        get_val_dataset(corrupt_ds, worker_config=wc, batch_size=2)
    empty = tmp_path_factory.mktemp("unprepared")
    info_json = str(empty / ".nv-meta" / ".info.json")
    with pytest.raises(DatasetNotPreparedError, match=f"no {info_json}.*energon prepare") as raised:
        get_train_dataset(
            empty,
            worker_config=wc,
            batch_size=2,
            shuffle_buffer_size=None,
            max_samples_per_sequence=None,
        )
    assert isinstance(raised.value, FileNotFoundError)  # what callers caught before


def test_too_many_streams_for_a_tiny_training_set(corrupt_ds):
    wc = WorkerConfig(rank=0, world_size=4, num_workers=4)
    with pytest.raises(ValueError, match="fewer than the 16 logical streams"):
        get_train_dataset(
            corrupt_ds,
            worker_config=wc,
            batch_size=2,
            shuffle_buffer_size=None,
            max_samples_per_sequence=None,
        )
