"""The prepared shard table: the same split as ``.info.json`` + the split config say, read block by
block, and never used once it no longer matches the dataset."""

from __future__ import annotations

import warnings

import pytest
from click.testing import CliRunner

from energon import WorkerConfig, get_savable_loader, get_train_dataset
from energon.cli.main import cli
from energon.errors import UnknownSplitError
from energon.format.layout import SHARD_TABLE_FILENAME
from energon.format.shard_table import SplitTable
from energon.format.split_shards import listed_split, open_split_shards, write_shard_table
from energon.plan.sharding import slice_bounds
from energon.source.webdataset import WebdatasetLeaf
from tests.helpers.datasets import make_text_dataset

SPLIT = (("train", 0.8), ("val", 0.2))


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """70 shards of 3-7 samples (the table's blocks hold 32 shards: three blocks)."""
    root = tmp_path_factory.mktemp("table") / "ds"
    return make_text_dataset(root, num_samples=350, num_shards=70, split=SPLIT)


def _same_split(a, b) -> None:
    assert (a.shards.num_shards, a.shards.samples) == (b.shards.num_shards, b.shards.samples)
    n = a.shards.num_shards
    assert [a.shards.start(s) for s in range(n + 1)] == [b.shards.start(s) for s in range(n + 1)]
    assert [a.shards.name(s) for s in range(n)] == [b.shards.name(s) for s in range(n)]
    assert [a.shards.tar_file_id(s) for s in range(n)] == [
        b.shards.tar_file_id(s) for s in range(n)
    ]
    assert all(a.shards.shard_of(i) == b.shards.shard_of(i) for i in range(a.shards.samples))
    assert a.shards.digest == b.shards.digest
    assert (a.excluded, a.checksums) == (b.excluded, b.checksums)


@pytest.fixture(scope="module")
def paged(tmp_path_factory):
    """The same shards in a table of all three levels: blocks of 4 shards, pages of 4 blocks
    (train: 56 shards, 14 blocks, 4 pages; val: 14 shards, 4 blocks, one block per page)."""
    root = tmp_path_factory.mktemp("paged") / "ds"
    make_text_dataset(root, num_samples=350, num_shards=70, split=SPLIT)
    write_shard_table(root, "split.yaml", block_shards=4, max_pages=4)
    return root


@pytest.mark.parametrize("split", ["train", "val"])
@pytest.mark.parametrize("levels", ["dataset", "paged"])
def test_the_table_says_what_info_and_split_config_say(request, levels, split):
    root = request.getfixturevalue(levels)
    opened = open_split_shards(str(root), split, "split.yaml")
    assert isinstance(opened.shards, SplitTable)
    _same_split(opened, listed_split(str(root), split, "split.yaml"))


def _recorded_reads(table: SplitTable) -> list[tuple[int, int]]:
    reads: list[tuple[int, int]] = []
    read = table.file.read

    def recording(start: int, end: int) -> bytes:
        reads.append((start, end))
        return read(start, end)

    table.file.read = recording
    return reads


def test_a_range_costs_one_read_per_level_and_only_its_own_blocks(paged):
    leaf = WebdatasetLeaf.open(paged, split_part="train")
    table = leaf.shards
    assert (table.block_shards, table.page_blocks, table.num_blocks) == (4, 4, 14)
    reads = _recorded_reads(table)
    listed = listed_split(str(paged), "train", "split.yaml").shards
    first, end = listed.start(14) + 1, listed.start(39) - 1  # shards 14..38: blocks 3..9
    bounds = slice_bounds(first, end, leaf.shard_starts, None)
    assert bounds.tolist() == slice_bounds(first, end, listed.starts[:-1].tolist(), None).tolist()
    assert len(reads) == 2  # the directory of pages 0..2, then blocks 3..9 in one read
    assert sorted(table._pages) == [0, 1, 2] and sorted(table._blocks) == list(range(3, 10))
    directory, blocks = reads
    assert directory == (table.directory, table.directory + 16 * 12)
    block_bytes, _ = table.read_costs()
    assert blocks[1] - blocks[0] == int(block_bytes[3:10].sum())
    for shard in range(14, 39):  # what the rank then asks of its shards: nothing more to read
        table.start(shard + 1), table.name(shard), table.tar_file_id(shard)
    assert len(reads) == 3  # read_costs read the whole directory (simulate's question)


def test_a_table_of_an_older_format_is_not_used_and_says_how_to_write_it_again(tmp_path):
    root = make_text_dataset(tmp_path / "ds", num_samples=20, num_shards=2)
    path = root / ".nv-meta" / SHARD_TABLE_FILENAME
    data = path.read_bytes()
    path.write_bytes(data.replace(b'"format": 2', b'"format": 1', 1))
    message = _stale_warning(root)
    assert "format 1" in message and "shard-table-only" in message
    result = CliRunner().invoke(cli, ["prepare", "--shard-table-only", str(root)])
    assert result.exit_code == 0, result.output
    assert path.read_bytes() == data


def test_a_rank_reads_only_the_blocks_of_its_own_samples(dataset):
    leaf = WebdatasetLeaf.open(dataset, split_part="train")
    table = leaf.shards
    assert table.num_shards == 56 and table.block_shards == 32
    assert table._blocks == {}  # opening reads the front part only
    last = len(leaf) - 1
    assert leaf.locate(last)[0] == 55
    assert sorted(table._blocks) == [1]
    list(leaf.shard_starts[40:50])
    assert sorted(table._blocks) == [1]
    listed = listed_split(str(dataset), "train", "split.yaml").shards.starts[:-1].tolist()
    first = len(leaf) - 30
    lazy = slice_bounds(first, len(leaf), leaf.shard_starts, None)
    assert lazy.tolist() == slice_bounds(first, len(leaf), listed, None).tolist()
    assert sorted(table._blocks) == [1]  # the searches went through the summary


def test_a_leaf_from_the_table_loads_like_one_from_the_lists(dataset):
    wc = WorkerConfig(rank=1, world_size=3, num_workers=0)

    def keys() -> list[str]:
        ds = get_train_dataset(
            dataset,
            worker_config=wc,
            batch_size=4,
            shuffle_buffer_size=10,
            max_samples_per_sequence=3,
        )
        it = iter(get_savable_loader(ds))
        return [k for _ in range(12) for k in next(it)["__key__"]]

    table = dataset / ".nv-meta" / SHARD_TABLE_FILENAME
    from_table = keys()
    saved = table.read_bytes()
    table.unlink()
    try:
        assert keys() == from_table
    finally:
        table.write_bytes(saved)


def _stale_warning(root, split="train") -> str:
    with pytest.warns(UserWarning, match="shard-table-only") as caught:
        opened = open_split_shards(str(root), split, "split.yaml")
    assert not isinstance(opened.shards, SplitTable)
    return str(caught[0].message)


def test_an_edited_split_config_is_noticed_and_a_new_table_picks_up_its_excludes(tmp_path):
    root = make_text_dataset(tmp_path / "ds", num_samples=40, num_shards=4)
    listed = listed_split(str(root), "train", "split.yaml")
    shard = listed.shards.name(2)
    split_yaml = root / ".nv-meta" / "split.yaml"
    key = _first_key(root, listed, 2)
    split_yaml.write_text(
        split_yaml.read_text().replace("exclude: []", f"exclude:\n- {shard}/{key}")
    )
    assert "split.yaml changed" in _stale_warning(root)
    result = CliRunner().invoke(cli, ["prepare", "--shard-table-only", str(root)])
    assert result.exit_code == 0, result.output
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        opened = open_split_shards(str(root), "train", "split.yaml")
    assert opened.excluded == frozenset({listed.shards.start(2)})
    _same_split(opened, listed_split(str(root), "train", "split.yaml"))


def _first_key(root, listed, shard: int) -> str:
    leaf = WebdatasetLeaf.open(root, split_part="train")
    return leaf.load(listed.shards.start(shard), None, ())["__key__"]


def test_a_dataset_prepared_again_without_the_table_is_noticed(tmp_path):
    root = make_text_dataset(tmp_path / "ds", num_samples=20, num_shards=2)
    (root / ".nv-meta" / "index.uuid").write_text("00000000-0000-4000-8000-000000000000")
    assert "prepared again" in _stale_warning(root)


def test_a_damaged_or_foreign_table_is_not_used(tmp_path):
    root = make_text_dataset(tmp_path / "ds", num_samples=20, num_shards=2)
    (root / ".nv-meta" / SHARD_TABLE_FILENAME).write_bytes(b"not a table at all")
    assert "not a shard table" in _stale_warning(root)
    (root / ".nv-meta" / SHARD_TABLE_FILENAME).write_bytes(b"ENSHTAB")
    assert "damaged" in _stale_warning(root)


def test_a_small_dataset_without_a_table_loads_quietly(tmp_path):
    root = make_text_dataset(tmp_path / "ds", num_samples=20, num_shards=2)
    (root / ".nv-meta" / SHARD_TABLE_FILENAME).unlink()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        opened = open_split_shards(str(root), "train", "split.yaml")
    assert opened.shards.samples == 20


def test_an_unknown_split_is_the_same_error_with_or_without_the_table(dataset):
    with pytest.raises(UnknownSplitError, match=r"'nope'.*\['train', 'val'\]"):
        open_split_shards(str(dataset), "nope", "split.yaml")
    with pytest.raises(UnknownSplitError, match=r"'nope'.*\['train', 'val'\]"):
        listed_split(str(dataset), "nope", "split.yaml")
