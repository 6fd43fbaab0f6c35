"""Joins by sample key, JSONL datasets, crude samples with cookers and aux data sources."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from click.testing import CliRunner

from energon import (
    Cooker,
    TextSample,
    WorkerConfig,
    basic_sample_keys,
    cooker,
    get_savable_loader,
    get_train_dataset,
    get_val_dataset,
    stateless,
)
from energon.cli.main import cli
from energon.errors import DatasetNotPreparedError
from energon.task_encoder import DefaultTaskEncoder
from tests.helpers.datasets import make_text_dataset


def joined_text(primary, secondary):
    """Join function: the primary's text plus the secondary's (or a marker when missing)."""
    other = secondary.text if secondary is not None else "<none>"
    return TextSample.derive_from(primary, text=primary.text + "|" + other)


@pytest.fixture(scope="module")
def join_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("join")
    make_text_dataset(root / "a", num_samples=55, num_shards=5)
    make_text_dataset(root / "b", num_samples=55, num_shards=5, seed=3)  # same keys, other texts
    make_text_dataset(root / "c", num_samples=40, num_shards=5, seed=4)  # 8 of each shard's 11 keys
    return root


def join_yaml(root, name, secondary, nonmatch):
    path = root / name
    path.write_text(
        f"""
__module__: megatron.energon
__class__: MetadatasetV2
splits:
  train:
    join:
      - path: ./a
      - path: ./{secondary}
        nonmatch: {nonmatch}
    joiner:
      __module__: {joined_text.__module__}
      __function__: joined_text
"""
    )
    return path


def val_texts(path):
    wc = WorkerConfig(rank=0, world_size=1, num_workers=0)
    loader = get_savable_loader(
        get_val_dataset(path, split_part="train", worker_config=wc, batch_size=None)
    )
    return [(s.__key__, s.text) for s in loader]


@pytest.mark.parametrize("nonmatch,rows", [("error", 55), ("skip", 40), ("none", 55)])
def test_join_modes(join_root, nonmatch, rows):
    secondary = "b" if nonmatch == "error" else "c"
    path = join_yaml(join_root, f"join_{nonmatch}.yaml", secondary, nonmatch)
    result = CliRunner().invoke(cli, ["prepare", str(path)])
    assert result.exit_code == 0, result.output
    assert "Joined" in result.output
    got = val_texts(path)
    assert len(got) == rows
    plain_a = dict(val_texts(join_root / "a"))
    plain_other = dict(val_texts(join_root / secondary))
    for key, text in got:
        left, right = text.split("|")
        assert left == plain_a[key]
        assert right == plain_other.get(key, "<none>")
    if nonmatch == "none":
        assert sum(text.endswith("|<none>") for _, text in got) == 15


def test_join_with_missing_match_fails_at_prepare(join_root):
    path = join_yaml(join_root, "join_bad.yaml", "c", "error")
    result = CliRunner().invoke(cli, ["prepare", str(path)])
    assert result.exit_code == 1  # one line, not a traceback (issue 33)
    assert "has no match" in result.output and "Traceback" not in result.output


def test_join_without_prepared_index_says_so(join_root):
    path = join_yaml(join_root, "join_unprepared.yaml", "b", "error")
    with pytest.raises(FileNotFoundError, match="energon prepare"):
        val_texts(path)


def test_joined_samples_restore_from_shuffle_buffers(join_root):
    path = join_yaml(join_root, "join_restore.yaml", "b", "error")
    CliRunner().invoke(cli, ["prepare", str(path)])
    wc = WorkerConfig(rank=0, world_size=1, num_workers=2)

    def loader():
        return get_savable_loader(
            get_train_dataset(
                path,
                worker_config=wc,
                batch_size=4,
                shuffle_buffer_size=10,
                max_samples_per_sequence=5,
            )
        )

    first = loader()
    it = iter(first)
    for _ in range(5):
        next(it)
    state = first.save_state_rank()
    expected = [next(it).text for _ in range(6)]
    again = loader()
    again.restore_state_rank(state)
    it2 = iter(again)
    assert [next(it2).text for _ in range(6)] == expected


def test_split_is_part_of_the_join_index_name(join_root):
    from energon.format.join_index import join_index_name
    from energon.metadataset.config import JoinMember
    from energon.metadataset.join_members import resolve_join_member

    a_train = resolve_join_member(JoinMember(path="a"), str(join_root), "train")
    (join_root / "a" / ".nv-meta" / "split2.yaml").write_text(
        "split_parts:\n  train: []\n  other: ['parts/data-00000.tar']\n"
    )
    a_other = resolve_join_member(
        JoinMember(path="a", split_config="split2.yaml"), str(join_root), "other"
    )
    assert join_index_name([a_train]) != join_index_name([a_other])


# ------------------------------------------------------------------------------------------
# JSONL and cooking


@stateless
def cook_record(sample):
    return TextSample(**basic_sample_keys(sample), text=sample["json"]["text"].upper())


class RecordEncoder(DefaultTaskEncoder):
    cookers = [Cooker(cook_record)]


def test_jsonl_prepare_and_cook(tmp_path):
    path = tmp_path / "records.jsonl"
    lines = [json.dumps({"text": f"record {i}"}) for i in range(23)]
    path.write_text("\n".join(lines[:5]) + "\n\n" + "\n".join(lines[5:]) + "\n")
    result = CliRunner().invoke(cli, ["prepare", str(path)])
    assert result.exit_code == 0 and "Found 23 samples" in result.output
    wc = WorkerConfig(rank=0, world_size=1, num_workers=0)
    raw = list(get_savable_loader(get_val_dataset(path, worker_config=wc, batch_size=None)))
    assert [s["json"]["text"] for s in raw] == [f"record {i}" for i in range(23)]
    assert raw[3]["__key__"] == "3"
    cooked = get_savable_loader(
        get_train_dataset(
            path,
            worker_config=wc,
            batch_size=5,
            shuffle_buffer_size=None,
            max_samples_per_sequence=None,
            task_encoder=RecordEncoder(),
        )
    )
    it = iter(cooked)
    texts = Counter(t for _ in range(46 // 5) for t in next(it).text)
    assert set(texts) <= {f"RECORD {i}" for i in range(23)}
    path.write_text(path.read_text() + json.dumps({"text": "late"}) + "\n")
    with pytest.raises(ValueError, match="Regenerate the index"):
        get_val_dataset(path, worker_config=wc, batch_size=None)


@cooker(need_primary=True)
def cook_with_aux(sample, captions, primary):
    extra = captions.get(sample["__key__"] + ".txt", sample)
    own = primary.get(".txt")
    return TextSample(**basic_sample_keys(sample), text=own + "+" + extra)


class AuxEncoder(DefaultTaskEncoder):
    cookers = [Cooker(stateless(cook_with_aux), has_subflavors={"kind": "crude"})]


def test_crude_dataset_with_aux_folder_and_primary_store(tmp_path, join_root):
    crude = make_text_dataset(tmp_path / "crude", num_samples=12, num_shards=2, seed=7)
    (crude / ".nv-meta" / "dataset.yaml").write_text(
        "__module__: megatron.energon\n__class__: CrudeWebdataset\nsubflavors: {kind: crude}\n"
    )
    captions = tmp_path / "captions"
    captions.mkdir()
    wc = WorkerConfig(rank=0, world_size=1, num_workers=0)
    keys = [
        s["__key__"]
        for s in get_savable_loader(
            get_val_dataset(crude, split_part="train", worker_config=wc, batch_size=None)
        )
    ]
    for key in keys:
        (captions / f"{key}.txt").write_text(f"aux of {key}")
    mds = tmp_path / "aux.yaml"
    mds.write_text(
        """
__module__: megatron.energon
__class__: MetadatasetV2
splits:
  train:
    path: ./crude
    aux:
      captions: filesystem://captions
"""
    )
    loader = get_savable_loader(
        get_val_dataset(
            mds, split_part="train", worker_config=wc, batch_size=None, task_encoder=AuxEncoder()
        )
    )
    got = list(loader)
    assert len(got) == 12
    for sample in got:
        own, extra = sample.text.split("+")
        assert extra == f"aux of {sample.__key__}"
        assert own and own != extra


@cooker(need_primary=True)
def cook_from_primary(sample, primary):
    return TextSample(**basic_sample_keys(sample), text=primary.get(".txt"))


class PrimaryOnlyEncoder(DefaultTaskEncoder):
    cookers = [Cooker(cook_from_primary)]


def test_unopenable_primary_store_stops_the_run(tmp_path):
    """Opening a cooker's primary store fails before any sample is read: a typed, fatal error
    naming the missing file, not a skipped sample."""
    crude = make_text_dataset(tmp_path / "crude", num_samples=6, num_shards=1)
    (crude / ".nv-meta" / "dataset.yaml").write_text(
        "__module__: megatron.energon\n__class__: CrudeWebdataset\n"
    )
    (crude / ".nv-meta" / "index.sqlite").unlink()  # the primary store's index
    wc = WorkerConfig(rank=0, world_size=1, num_workers=0)
    dataset = get_val_dataset(
        crude,
        split_part="train",
        worker_config=wc,
        batch_size=None,
        task_encoder=PrimaryOnlyEncoder(),
    )
    with pytest.raises(DatasetNotPreparedError, match="index.sqlite does not exist") as raised:
        next(iter(get_savable_loader(dataset)))
    assert isinstance(raised.value, FileNotFoundError)


def test_aux_and_primary_stores_give_media_metadata(tmp_path):
    from click.testing import CliRunner as Runner

    from energon.source.file_store import PrimaryFileStore, SystemFileStore, WebdatasetFileStore
    from tests.helpers.datasets import make_captioning_dataset

    ds = make_captioning_dataset(tmp_path / "imgs", num_samples=6, num_shards=1)
    assert (
        Runner().invoke(cli, ["prepare-media", str(ds), "--media-metadata-by-extension"]).exit_code
        == 0
    )
    folder = tmp_path / "folder"
    folder.mkdir()
    from PIL import Image

    Image.new("RGB", (32, 16)).save(folder / "a.png")
    assert (
        Runner()
        .invoke(cli, ["prepare-media", str(folder), "--media-metadata-by-extension"])
        .exit_code
        == 0
    )
    assert SystemFileStore(str(folder)).get_media_metadata("a.png").width == 32
    store = WebdatasetFileStore(str(ds))
    wc = WorkerConfig(rank=0, world_size=1, num_workers=0)
    first = next(
        iter(
            get_savable_loader(
                get_val_dataset(ds, split_part="train", worker_config=wc, batch_size=None)
            )
        )
    )
    meta = PrimaryFileStore(store, first.__key__).get_media_metadata(".jpg")
    assert (meta.height, meta.width) == tuple(first.image.shape[1:])
