"""Parquet and Arrow datasets as a first-class kind: the same samples as tar shards load the same
way (field maps, decoding, order, save/restore, elastic restore), folders and files used as they
are, HF-style image/audio columns, and ``energon prepare`` / ``energon info``."""

from __future__ import annotations

import json
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from click.testing import CliRunner

from energon import (
    Cooker,
    DefaultTaskEncoder,
    ImageClassificationSample,
    TextSample,
    WorkerConfig,
    basic_sample_keys,
    get_savable_loader,
    get_train_dataset,
    get_val_dataset,
    redistribute_states,
    stateless,
)
from energon.cli.main import cli
from tests.helpers.datasets import make_captioning_dataset
from tests.helpers.parquet import jpeg_bytes, tar_as_parquet, wav_bytes


@pytest.fixture(scope="module")
def tar_ds(tmp_path_factory):
    root = tmp_path_factory.mktemp("tar")
    return make_captioning_dataset(
        root, num_samples=48, num_shards=4, split=(("train", 0.75), ("val", 0.25))
    )


@pytest.fixture(scope="module")
def pq_ds(tar_ds, tmp_path_factory):
    return tar_as_parquet(tar_ds, tmp_path_factory.mktemp("pq"), row_group_size=5)


def _val(path, workers=0, **kwargs):
    wc = WorkerConfig(rank=0, world_size=1, num_workers=workers)
    return list(
        get_savable_loader(get_val_dataset(path, worker_config=wc, batch_size=None, **kwargs))
    )


def _train(path, *, rank=0, world_size=1, workers=0, num_streams=None):
    wc = WorkerConfig(rank=rank, world_size=world_size, num_workers=workers)
    ds = get_train_dataset(
        path,
        worker_config=wc,
        batch_size=3,
        shuffle_buffer_size=7,
        max_samples_per_sequence=4,
        **({"num_streams": num_streams} if num_streams else {}),
    )
    return get_savable_loader(ds)


def _take(loader, n):
    it = iter(loader)
    return [next(it) for _ in range(n)]


def test_same_samples_as_tar_shards(tar_ds, pq_ds):
    tar, parquet = _val(tar_ds, workers=2), _val(pq_ds, workers=2)
    assert [s.__key__ for s in parquet] == [s.__key__ for s in tar]
    for a, b in zip(parquet, tar):
        assert a.caption == b.caption and torch.equal(a.image, b.image)
    assert parquet[0].__sources__[0].shard_name.endswith(".parquet")


@pytest.mark.parametrize("workers", [0, 2])
def test_training_order_equals_the_tar_dataset(tar_ds, pq_ds, workers):
    """Files stand where shards stood: the same counts give the same plan, so the same order."""
    tar = [tuple(b.__key__) for b in _take(_train(tar_ds, workers=workers), 8)]
    parquet = [tuple(b.__key__) for b in _take(_train(pq_ds, workers=workers), 8)]
    assert parquet == tar


@pytest.mark.parametrize("workers", [0, 2])
def test_restore_continues_exactly(pq_ds, workers):
    loader = _train(pq_ds, workers=workers)
    it = iter(loader)
    for _ in range(5):
        next(it)
    state = json.loads(json.dumps(loader.save_state_rank()))
    expected = [next(it) for _ in range(6)]
    restored = _train(pq_ds, workers=workers)
    restored.restore_state_rank(state)
    got = _take(restored, 6)
    assert [list(b.__key__) for b in got] == [list(b.__key__) for b in expected]
    assert all(torch.equal(a.image, b.image) for a, b in zip(got, expected))


def test_elastic_restore_continues_the_global_sequence(pq_ds):
    def run(world_size, workers, steps, states=None):
        loaders = [
            _train(pq_ds, rank=r, world_size=world_size, workers=workers, num_streams=4)
            for r in range(world_size)
        ]
        for loader, state in zip(loaders, states or [None] * world_size):
            if state is not None:
                loader.restore_state_rank(state)
        per_rank = [[tuple(b.__key__) for b in _take(loader, steps)] for loader in loaders]
        order = [per_rank[r][k] for k in range(steps) for r in range(world_size)]
        return order, [loader.save_state_rank() for loader in loaders]

    reference, _ = run(1, 0, 16)
    before, states = run(2, 1, 4)
    assert before == reference[:8]
    after, _ = run(1, 2, 8, redistribute_states(states, 1))
    assert after == reference[8:16]


@stateless
def cook_text(sample: dict) -> TextSample:
    return TextSample(**basic_sample_keys(sample), text=f"{sample['txt']}|{len(sample['jpg'])}")


class _Cook(DefaultTaskEncoder):
    cookers = [Cooker(cook_text)]


def test_folder_and_single_file_used_as_they_are(pq_ds, tmp_path):
    plain = tmp_path / "plain"
    shutil.copytree(pq_ds, plain, ignore=shutil.ignore_patterns(".nv-meta"))
    expected = [s.__key__ for s in _val(pq_ds, split_part="train")]
    expected += [s.__key__ for s in _val(pq_ds, split_part="val")]
    texts = _val(plain, task_encoder=_Cook())
    assert len(texts) == 48 and texts[0].text.split("|")[1].isdigit()
    # crude keys are <file>/<row>; the files in path order hold the samples in shard order
    files = sorted(p.relative_to(plain).as_posix() for p in plain.rglob("*.parquet"))
    assert texts[0].__key__ == f"{files[0]}/0"
    single = _val(plain / files[1], task_encoder=_Cook())
    name = files[1].rsplit("/", 1)[-1]  # a single file's rows are keyed by its own name
    assert [s.__key__ for s in single] == [f"{name}/{i}" for i in range(12)]
    assert sorted(expected) == sorted(pq.read_table(plain).column("key").to_pylist())


@pytest.mark.parametrize("arrow", ["file", "stream"])
def test_arrow_ipc_files_load_like_parquet(tar_ds, pq_ds, tmp_path, arrow):
    out = tar_as_parquet(tar_ds, tmp_path / arrow, row_group_size=5, arrow=arrow)
    a, b = _val(out), _val(pq_ds)
    assert [s.__key__ for s in a] == [s.__key__ for s in b]
    assert all(torch.equal(x.image, y.image) and x.caption == y.caption for x, y in zip(a, b))


def test_hf_style_image_and_audio_columns_decode_like_tar_parts(tmp_path):
    n = 6
    image_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    table = pa.table(
        {
            "picture": pa.array(
                [{"bytes": jpeg_bytes(i * 40), "path": f"img{i}.jpg"} for i in range(n)],
                image_type,
            ),
            "sound": [wav_bytes(400 + i, seed=i) for i in range(n)],
            "label": list(range(n)),
            "meta": [{"speaker": f"s{i}", "lang": "en"} for i in range(n)],
            "note": [f"note {i}".encode() for i in range(n)],
        }
    )
    root = tmp_path / "hf"
    (root / "data").mkdir(parents=True)
    pq.write_table(table, root / "data" / "train-00000-of-00001.parquet", row_group_size=4)
    result = CliRunner().invoke(
        cli,
        [
            "prepare",
            str(root),
            "--non-interactive",
            "--split-ratio",
            "1,0,0",
            "--sample-type",
            "CrudeWebdataset",
        ],
    )
    assert result.exit_code == 0, result.output
    samples = _val(root, split_part="train")
    assert len(samples) == n
    first = samples[0]
    assert first["picture"].shape == (3, 10, 14)  # a struct {bytes, path} decodes by its path
    assert first["label"] == 0 and first["meta"] == {"speaker": "s0", "lang": "en"}
    assert first["sound"].get_audio().audio_clips[0].shape[-1] == 400  # WAV sniffed, lazy AV
    assert first["note"] == b"note 0"  # binary, neither named nor sniffable: stays bytes
    # a typed sample through a field map with accessors into a struct column; how a binary
    # column decodes can be said (column_extensions)
    (root / ".nv-meta" / "dataset.yaml").write_text(
        "sample_type: {__module__: energon, __class__: ImageClassificationSample}\n"
        "field_map: {image: picture, label: label, label_name: 'meta[speaker]'}\n"
    )
    typed = _val(root, split_part="train")
    assert isinstance(typed[2], ImageClassificationSample)
    assert (typed[2].label, typed[2].label_name) == (2, "s2")
    assert typed[2].image.shape == (3, 10, 14)
    (root / ".nv-meta" / "dataset.yaml").write_text(
        "sample_type: {__module__: energon, __class__: ImageClassificationSample}\n"
        "field_map: {image: picture, label_name: note}\n"
        "column_extensions: {note: txt}\n"
    )
    assert _val(root, split_part="train")[3].label_name == "note 3"


def test_cli_prepare_and_info(pq_ds, tmp_path):
    root = tmp_path / "again"
    shutil.copytree(pq_ds, root, ignore=shutil.ignore_patterns(".nv-meta"))
    args = ["prepare", str(root), "--non-interactive", "--split-ratio", "1,0,0"]
    args += [
        "--sample-type",
        "CaptioningSample",
        "--field-map",
        '{"image": "jpg", "caption": "txt"}',
    ]
    result = CliRunner().invoke(cli, args + ["--key-column", "key"])
    assert result.exit_code == 0, result.output
    assert "Found 48 rows in 4 files" in result.output
    again = CliRunner().invoke(cli, args)
    assert again.exit_code != 0 and "already been prepared" in again.output
    info = CliRunner().invoke(cli, ["info", str(root)])
    assert info.exit_code == 0, info.output
    assert (
        "Total rows: 48 rows" in info.output
        and "* train: 100.00% (48 rows, 4 files)" in info.output
    )
    assert sorted(s.__key__ for s in _val(root, split_part="train")) == sorted(
        s.__key__ for s in _val(pq_ds, split_part="train") + _val(pq_ds, split_part="val")
    )


def test_column_chunks_are_mapped_to_their_top_level_columns(tmp_path):
    """Struct, list and map columns store a chunk per leaf, and names may hold dots: the index
    maps every column chunk to its column (what remote reads of a field map's columns use)."""
    from energon.format.parquet import scan_file

    table = pa.table(
        {
            "image.png": [b"png"] * 3,
            "image": [{"bytes": b"jpg", "path": "a.jpg"}] * 3,
            "tags": [["a", "b"]] * 3,
            "meta": pa.array([[("k", 1)]] * 3, type=pa.map_(pa.string(), pa.int64())),
            "txt": ["text"] * 3,
        }
    )
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=2)
    layout = scan_file(str(tmp_path / "t.parquet"), "t.parquet")
    assert layout.leaf_columns == ["image.png", "image", "image", "tags", "meta", "meta", "txt"]
    meta = pq.ParquetFile(tmp_path / "t.parquet").metadata
    for g in range(meta.num_row_groups):
        for c in range(meta.num_columns):
            chunk = meta.row_group(g).column(c)
            assert layout.chunks[g, c, 1] == chunk.total_compressed_size
            assert layout.chunks[g, c, 0] in (chunk.data_page_offset, chunk.dictionary_page_offset)
