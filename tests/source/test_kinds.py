"""One dispatch for leaf kinds (``source.kinds``), the leaf-dataset protocol every leaf class keeps,
and the shard reader's contract (the leaf hands it the byte index of its files)."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from energon import SampleDecoder, TextSample
from energon.format.jsonl import prepare_jsonl
from energon.format.parquet import prepare_parquet
from energon.megatron.gpt_dataset import GPTConfig
from energon.metadataset.resolve import resolve_dataset
from energon.prepare.join_indices import prepare_metadataset
from energon.source.join import JoinLeaf, JoinSpec
from energon.source.jsonl import JsonlLeaf
from energon.source.kinds import detect_kind, open_leaf
from energon.source.leaf import LEAF_KINDS, LeafBuilder, LeafDataset
from energon.source.parquet import ParquetLeaf
from energon.source.shard_reader import RecordOffsets, ShardReader
from energon.source.tokens import TokenLeaf
from energon.source.webdataset import WebdatasetLeaf
from tests.helpers.datasets import make_text_dataset, write_prefix

# Everything the plan, the pipeline, the loader and the metadataset resolver use of a leaf.
PROTOCOL_MEMBERS = (
    "kind",
    "root",
    "split_part",
    "subflavors",
    "builder",
    "excluded",
    "shard_starts",
    "remote",
    "__len__",
    "load",
    "prefetch",
    "fingerprint",
    "config",
)


def joined_text(primary, secondary):
    return TextSample.derive_from(primary, text=primary.text + "|" + secondary.text)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("kinds")
    make_text_dataset(root / "wds", num_samples=30, num_shards=3)
    make_text_dataset(root / "other", num_samples=30, num_shards=3, seed=5)  # same keys
    jsonl = root / "records.jsonl"
    jsonl.write_text("".join(json.dumps({"n": i}) + "\n" for i in range(7)))
    prepare_jsonl(jsonl)
    write_prefix(str(root / "tokens"), num_docs=40)
    mix = root / "mix.yaml"
    mix.write_text(
        f"""
__module__: megatron.energon
__class__: MetadatasetV2
splits:
  train:
    join:
      - path: ./wds
      - path: ./other
    joiner:
      __module__: {joined_text.__module__}
      __function__: joined_text
"""
    )
    prepare_metadataset(mix, progress=False)
    (root / "table").mkdir()
    pq.write_table(pa.table({"txt": [f"row {i}" for i in range(9)]}), root / "table" / "a.parquet")
    prepare_parquet(root / "table", progress=False)
    (root / "table" / ".nv-meta" / "dataset.yaml").write_text(
        "sample_type: {__module__: energon, __class__: TextSample}\nfield_map: {text: txt}\n"
    )
    return root


def token_config(root) -> GPTConfig:
    return GPTConfig(
        sequence_length=8,
        split="90,10,0",
        tokenizer={"class": "Byte"},
        eod_token=0,
        path_to_cache=str(root / "token-cache"),
    )


def open_every_kind(root) -> dict[str, LeafDataset]:
    join = resolve_dataset(str(root / "mix.yaml"), split_part="train", training=False)
    return {
        "webdataset": open_leaf(str(root / "wds"), split_part="train"),
        "jsonl": open_leaf(str(root / "records.jsonl"), split_part="train"),
        "tokens": open_leaf(
            str(root / "tokens"), split_part="train", token_config=token_config(root)
        ),
        "join": join.sources[0].leaf,
        "parquet": open_leaf(str(root / "table"), split_part="train"),
    }


def test_each_path_kind_is_detected(data):
    assert detect_kind(str(data / "wds")) == "webdataset"
    assert detect_kind(data / "records.jsonl") == "jsonl"
    assert detect_kind(str(data / "tokens")) == "tokens"
    spec = JoinSpec(members=(), index_path=str(data / "mix.yaml.cache" / "x.bin"))
    assert detect_kind(spec) == "join"
    assert detect_kind(str(data / "table")) == "parquet"
    assert detect_kind(str(data / "table" / "a.parquet")) == "parquet"


def test_each_kind_opens_as_its_class_and_carries_its_kind(data):
    classes = {
        "webdataset": WebdatasetLeaf,
        "jsonl": JsonlLeaf,
        "tokens": TokenLeaf,
        "join": JoinLeaf,
        "parquet": ParquetLeaf,
    }
    leaves = open_every_kind(data)
    assert sorted(leaves) == sorted(LEAF_KINDS)
    for kind, leaf in leaves.items():
        assert type(leaf) is classes[kind]
        assert leaf.kind == kind


def test_every_leaf_class_satisfies_the_protocol(data):
    for kind, leaf in open_every_kind(data).items():
        assert isinstance(leaf, LeafDataset), kind
        assert isinstance(leaf.builder, LeafBuilder), kind
        missing = [name for name in PROTOCOL_MEMBERS if not hasattr(leaf, name)]
        assert not missing, (kind, missing)
        assert len(leaf) > 0
        assert list(leaf.shard_starts)[0] == 0 and all(
            0 <= s < len(leaf) for s in leaf.shard_starts
        )
        assert isinstance(leaf.excluded, frozenset) and leaf.remote is False
        assert isinstance(leaf.builder.kind, str)
        json.dumps(leaf.fingerprint())
        json.dumps(leaf.config())
        leaf.prefetch(0, 1)  # local data: a no-op, but every leaf takes the hint
        sample = leaf.load(0, SampleDecoder(), ("key", 0))
        assert sample is not None
        again = pickle.loads(pickle.dumps(leaf))  # leaves travel into worker processes
        assert again.kind == kind and len(again) == len(leaf)


def test_crude_and_typed_builders(data):
    leaves = open_every_kind(data)
    assert leaves["jsonl"].builder.kind == "crude"
    assert leaves["webdataset"].builder.sample_type is TextSample
    assert leaves["webdataset"].builder.kind == "field_map"
    assert leaves["tokens"].builder.sample_type is None
    joined = leaves["join"].load(3, SampleDecoder(), ("key", 3))
    assert "|" in joined.text and joined.__restore_key__ == ("key", 3)


def test_an_object_without_the_contract_is_not_a_leaf():
    class NotALeaf:
        root = "x"
        split_part = "train"

        def __len__(self) -> int:
            return 1

    assert not isinstance(NotALeaf(), LeafDataset)


def test_none_of_the_kinds_is_a_clear_error_naming_the_path(tmp_path):
    folder = tmp_path / "raw"
    folder.mkdir()
    (folder / "a.tar").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match=rf"{folder}.*energon prepare"):
        detect_kind(str(folder))
    loose = tmp_path / "notes.txt"
    loose.write_text("hello")
    with pytest.raises(FileNotFoundError, match=str(loose)):
        open_leaf(str(loose), split_part="train")
    missing = tmp_path / "missing"
    with pytest.raises(FileNotFoundError, match=rf"dataset {missing} does not exist"):
        detect_kind(str(missing))
    half = tmp_path / "half"
    (tmp_path / "half.idx").write_bytes(b"")  # an .idx without its .bin is no token prefix
    with pytest.raises(FileNotFoundError, match=str(half)):
        detect_kind(str(half))


def test_a_token_prefix_needs_a_token_config(data):
    with pytest.raises(ValueError, match=r"tokens is a Megatron token prefix"):
        open_leaf(str(data / "tokens"), split_part="train")
    with pytest.raises(ValueError, match="splits train, val and test"):
        open_leaf(str(data / "tokens"), split_part="dev", token_config=token_config(data))


def test_the_shard_reader_reads_through_the_index_the_leaf_hands_it(tmp_path):
    path = tmp_path / "records.bin"
    path.write_bytes(b"aaabbbbcc")
    opened: list[str] = []

    def open_index(p: str) -> RecordOffsets:
        opened.append(p)
        return RecordOffsets(np.array([0, 3, 7, 9], dtype=np.uint64))

    reader = ShardReader()
    ranges = [reader.byte_range(str(path), i, open_index) for i in range(3)]
    assert ranges == [(0, 3), (3, 7), (7, 9)]
    assert opened == [str(path)]  # opened once, then kept
    assert [reader.read(str(path), *r) for r in ranges] == [b"aaa", b"bbbb", b"cc"]
    with pytest.raises(OSError, match="truncated"):
        reader.read(str(path), 7, 12)
