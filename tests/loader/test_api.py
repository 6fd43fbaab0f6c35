"""Loader API details: deprecated keyword arguments, raw bytes, sample_loader.py datasets,
AugmentTaskEncoder, state files on disk, restoring mid epochized blend."""

from __future__ import annotations

import json
import warnings

import pytest

from energon import (
    AugmentTaskEncoder,
    DefaultTaskEncoder,
    StateError,
    WorkerConfig,
    get_savable_loader,
    get_train_dataset,
    get_val_dataset,
    load_state_file,
    save_state_file,
)
from energon.pipeline.snapshot import reader_states
from tests.helpers.datasets import make_text_dataset

WC = WorkerConfig(rank=0, world_size=1, num_workers=0)


def test_deprecated_decode_and_handler_kwargs(captioning_ds):
    with pytest.warns(FutureWarning):
        ds = get_val_dataset(
            captioning_ds,
            split_part="train",
            worker_config=WC,
            batch_size=None,
            image_decode="pil",
            handler=print,
        )
    sample = next(iter(get_savable_loader(ds)))
    from PIL import Image

    assert isinstance(sample.image, Image.Image)


def test_decoder_none_gives_raw_bytes(captioning_ds):
    encoder = DefaultTaskEncoder()
    encoder.decoder = None
    ds = get_val_dataset(
        captioning_ds, split_part="train", worker_config=WC, batch_size=None, task_encoder=encoder
    )
    sample = next(iter(get_savable_loader(ds)))
    assert isinstance(sample.image, bytes) and sample.image[:2] == b"\xff\xd8"
    assert isinstance(sample.caption, bytes)


def test_sample_loader_dataset(tmp_path):
    root = make_text_dataset(tmp_path / "ds", num_samples=10, num_shards=1)
    (root / ".nv-meta" / "sample_loader.py").write_text(
        "def sample_loader(raw):\n"
        "    return dict(__key__='x' + raw['__key__'], text=raw['txt'].upper())\n"
        "def part_filter(part):\n"
        "    return part == 'txt'\n"
    )
    (root / ".nv-meta" / "dataset.yaml").write_text(
        "sample_type: {__module__: megatron.energon, __class__: TextSample}\n"
        "sample_loader: sample_loader.py:sample_loader\n"
        "part_filter: sample_loader.py:part_filter\n"
    )
    wc = WorkerConfig(rank=0, world_size=1, num_workers=2)
    got = list(
        get_savable_loader(
            get_val_dataset(root, split_part="train", worker_config=wc, batch_size=None)
        )
    )
    assert len(got) == 10
    assert all(s.__key__.startswith("x") and s.text == s.text.upper() for s in got)


class Tagging(AugmentTaskEncoder):
    def encode_sample(self, sample):
        sample = self._task_encoder.encode_sample(sample)
        sample.text = "tag:" + sample.text
        return sample


def test_augment_task_encoder_wraps_another(text_ds):
    ds = get_train_dataset(
        text_ds,
        worker_config=WC,
        batch_size=4,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
        task_encoder=Tagging(DefaultTaskEncoder()),
    )
    batch = next(iter(get_savable_loader(ds)))
    assert all(t.startswith("tag:") for t in batch.text)


def test_state_files_round_trip_and_damage_is_reported(text_ds, tmp_path):
    def loader():
        return get_savable_loader(
            get_train_dataset(
                text_ds,
                worker_config=WC,
                batch_size=3,
                shuffle_buffer_size=5,
                max_samples_per_sequence=5,
            )
        )

    first = loader()
    it = iter(first)
    for _ in range(4):
        next(it)
    path = tmp_path / "state.json"
    save_state_file(first.save_state_rank(), path)
    expected = [tuple(next(it).__key__) for _ in range(3)]
    again = loader()
    again.restore_state_rank(load_state_file(path))
    it2 = iter(again)
    assert [tuple(next(it2).__key__) for _ in range(3)] == expected

    truncated = tmp_path / "truncated.json"
    truncated.write_text(path.read_text()[:200])
    with pytest.raises(StateError, match="truncated"):
        load_state_file(truncated)
    torch_file = tmp_path / "state.pt"
    torch_file.write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(StateError, match="cannot read"):
        load_state_file(torch_file)
    edited = json.loads(path.read_text())
    reader_states(edited["streams"][0][1])[0]["epoch"] = "zero"
    with pytest.raises((StateError, ValueError)):
        again2 = loader()
        again2.restore_state_rank(edited)
        next(iter(again2))


def test_restore_mid_epochized_blend(text_ds, tmp_path):
    make_text_dataset(tmp_path / "b", num_samples=30, num_shards=2, seed=5)
    (tmp_path / "a").symlink_to(text_ds)
    mds = tmp_path / "epochized.yaml"
    mds.write_text(
        "__class__: MetadatasetV2\nsplits:\n  train:\n    blend_epochized:\n"
        "      - {path: ./a, repetitions: 2, subflavors: {src: a}}\n"
        "      - {path: ./b, repetitions: 1.5, subflavors: {src: b}}\n"
    )
    wc = WorkerConfig(rank=0, world_size=1, num_workers=2)

    def loader():
        return get_savable_loader(
            get_train_dataset(
                mds,
                worker_config=wc,
                batch_size=None,
                shuffle_buffer_size=4,
                max_samples_per_sequence=5,
                repeat=False,
            )
        )

    first = loader()
    it = iter(first)
    head = [next(it) for _ in range(100)]
    state = first.save_state_rank()
    tail = [(s.__subflavors__["src"], s.__key__) for s in it]
    assert len(head) + len(tail) == 120 * 2 + 45
    again = loader()
    again.restore_state_rank(state)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert [(s.__subflavors__["src"], s.__key__) for s in again] == tail
