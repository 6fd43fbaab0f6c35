"""Cross-compatibility with the reference implementation (megatron-energon 7.x), run as a black box.

The reference is installed into a side venv (``.cache/ref-venv``) on first use and reused. Both
directions are checked: a dataset prepared by us loads in the reference with every sample seen
exactly once, and a dataset prepared by the reference reads correctly with our format readers.
For the same input, both tools must write the same metadata.

Skipped (with the reason) when the side venv cannot be created, e.g. without network access.
Set ENERGON_SKIP_COMPAT=1 to skip on purpose.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

from energon.format.info import read_info
from energon.format.split import read_split
from energon.format.tar import split_member_name, split_sample_bytes
from energon.format.tar_index import TarIndex, tar_index_path
from energon.prepare.dataset import prepare_dataset
from tests.helpers.paths import REPO_ROOT
from tests.helpers.tarfiles import png_bytes, write_tar

pytestmark = pytest.mark.compat

REF_CLI = "from megatron.energon.cli.main import main; main()"


def _run_ref(
    ref_python: str, *args: str, script: str | None = None, stdin: str | None = None
) -> str:
    cmd = [ref_python, "-c", script] if script is not None else [ref_python, "-c", REF_CLI, *args]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=600, env=env, cwd="/", input=stdin
    )
    assert proc.returncode == 0, f"reference failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


# ---- the shared input ----------------------------------------------------------------------

NUM_SHARDS = 12  # unpadded names: sorted order data-0, data-1, data-10, data-11, data-2, ...


def _expected_samples() -> dict[str, dict[str, dict[str, bytes]]]:
    """shard -> key -> part -> payload; includes long names (GNU 'L' / PAX path) and odd members."""
    shards: dict[str, dict[str, dict[str, bytes]]] = {}
    k = 0
    for s in range(NUM_SHARDS):
        samples: dict[str, dict[str, bytes]] = {}
        for _ in range(3 + s % 4):
            key = f"{k:06d}" if k % 5 else f"{'deep/' * 25}{k:06d}"  # > 100 chars every 5th
            samples[key] = {"png": png_bytes(k), "txt": f"caption {k}".encode()}
            k += 1
        shards[f"parts/data-{s}.tar"] = samples
    return shards


def _write_shards(root: Path, expected) -> None:
    d = tarfile.TarInfo("somedir")
    d.type = tarfile.DIRTYPE
    for i, (shard, samples) in enumerate(expected.items()):
        members = [
            (f"{key}.{part}", data)
            for key, parts in samples.items()
            for part, data in parts.items()
        ]
        members.insert(2, ("__meta__/notes.txt", b"skipped member"))
        fmt = tarfile.PAX_FORMAT if i % 2 else tarfile.GNU_FORMAT
        write_tar(root / shard, members, fmt=fmt, extra=[d])


@pytest.fixture(scope="module")
def prepared_pair(ref_python, tmp_path_factory):
    """The same shards prepared by us (``ours``) and by the reference (``theirs``)."""
    expected = _expected_samples()
    ours = tmp_path_factory.mktemp("ours")
    theirs = tmp_path_factory.mktemp("theirs")
    _write_shards(ours, expected)
    for shard in expected:
        (theirs / shard).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ours / shard, theirs / shard)
    prepare_dataset(
        ours,
        split_parts_ratio=[("train", 8), ("val", 1), ("test", 1)],
        progress=False,
        num_workers=2,
    )
    _run_ref(
        ref_python,
        "prepare",
        str(theirs),
        "--non-interactive",
        "--split-ratio",
        "8,1,1",
        "--no-progress",
    )
    for root in (ours, theirs):
        (root / ".nv-meta" / "dataset.yaml").write_text(CAPTIONING_DATASET_YAML)
    return expected, ours, theirs


CAPTIONING_DATASET_YAML = yaml.dump(
    {
        "sample_type": {"__module__": "megatron.energon", "__class__": "CaptioningSample"},
        "field_map": {"image": "png", "caption": "txt"},
    },
    sort_keys=False,
)


# ---- (a) ours -> reference -----------------------------------------------------------------

LOAD_SCRIPT = """
import json, sys
from megatron.energon import WorkerConfig, get_loader, get_val_dataset
seen = []
for split in ("train", "val", "test"):
    ds = get_val_dataset(sys.argv[1], split_part=split, batch_size=1,
                         worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0))
    for batch in get_loader(ds):
        for key, caption in zip(batch.__key__, batch.caption):
            seen.append([split, key, caption])
print(json.dumps(seen))
"""


def test_reference_loads_our_dataset_every_sample_once(prepared_pair, ref_python):
    expected, ours, _ = prepared_pair
    out = _run_ref(ref_python, script=LOAD_SCRIPT.replace("sys.argv[1]", repr(str(ours))))
    seen = json.loads(out.strip().splitlines()[-1])
    all_keys = [key for samples in expected.values() for key in samples]
    assert sorted(key for _, key, _ in seen) == sorted(all_keys)  # each exactly once
    captions = {
        key: parts["txt"].decode()
        for samples in expected.values()
        for key, parts in samples.items()
    }
    assert all(caption == captions[key] for _, key, caption in seen)
    split = read_split(ours)
    for name in ("train", "val", "test"):
        keys_in_split = [k for shard in split.shards(name) for k in expected[shard]]
        assert sorted(k for s, k, _ in seen if s == name) == sorted(keys_in_split)


def test_reference_info_reads_our_dataset(prepared_pair, ref_python):
    _, ours, _ = prepared_pair
    out = _run_ref(ref_python, "info", str(ours))
    total = sum(read_info(ours).values())
    assert f"{total:,} samples" in out or f"{total} samples" in out


# ---- (b) reference -> our readers ----------------------------------------------------------


def test_our_readers_on_reference_prepared_dataset(prepared_pair):
    expected, _, theirs = prepared_pair
    counts = read_info(theirs)
    assert list(counts) == sorted(expected)  # the reference sorts shard paths as strings
    assert counts == {shard: len(samples) for shard, samples in expected.items()}
    split = read_split(theirs)
    assert sorted(s for name in ("train", "val", "test") for s in split.shards(name)) == sorted(
        expected
    )
    for shard, samples in expected.items():
        index = TarIndex(theirs / tar_index_path(shard))
        assert len(index) == len(samples)
        data = (theirs / shard).read_bytes()
        read_back = {}
        for i in range(len(index)):
            start, end = index.byte_range(i)
            parts = {}
            for name, payload in split_sample_bytes(data[start:end], base_offset=start, path=shard):
                key_part = split_member_name(name)
                if key_part is not None:
                    parts.setdefault(key_part[0], {})[key_part[1]] = bytes(payload)
            read_back.update(parts)
        assert read_back == samples


# ---- (c) same input, same metadata ---------------------------------------------------------


def test_info_json_equal(prepared_pair):
    _, ours, theirs = prepared_pair
    a = json.loads((ours / ".nv-meta" / ".info.json").read_text())
    b = json.loads((theirs / ".nv-meta" / ".info.json").read_text())
    assert list(a) == list(b) == ["energon_version", "shard_counts"]
    assert list(a["shard_counts"].items()) == list(b["shard_counts"].items())


def test_split_yaml_equal(prepared_pair):
    _, ours, theirs = prepared_pair
    assert (ours / ".nv-meta" / "split.yaml").read_text() == (
        theirs / ".nv-meta" / "split.yaml"
    ).read_text()


def test_tar_idx_bytes_equal(prepared_pair):
    expected, ours, theirs = prepared_pair
    for shard in expected:
        idx = tar_index_path(shard)
        assert (ours / idx).read_bytes() == (theirs / idx).read_bytes(), shard


def test_sqlite_rows_equal(prepared_pair):
    _, ours, theirs = prepared_pair
    queries = (
        "SELECT * FROM samples ORDER BY tar_file_id, sample_index",
        "SELECT * FROM sample_parts ORDER BY tar_file_id, sample_index, content_byte_offset",
    )
    for query in queries:
        a = sqlite3.connect(ours / ".nv-meta" / "index.sqlite").execute(query).fetchall()
        b = sqlite3.connect(theirs / ".nv-meta" / "index.sqlite").execute(query).fetchall()
        assert a and a == b


def test_sqlite_schema_equal(prepared_pair):
    _, ours, theirs = prepared_pair

    def schema(root):
        db = sqlite3.connect(root / ".nv-meta" / "index.sqlite")
        rows = db.execute(
            "SELECT type, name FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'"
        ).fetchall()
        return {
            name: [c[1:3] for c in db.execute(f"PRAGMA table_info({name})")]
            for kind, name in rows
            if kind == "table"
        }, sorted(name for kind, name in rows if kind == "index")

    ours_tables, ours_indexes = schema(ours)
    theirs_tables, theirs_indexes = schema(theirs)
    for table in ("samples", "sample_parts"):
        assert ours_tables[table] == theirs_tables[table]
    assert set(theirs_indexes) <= set(ours_indexes)


def test_sample_tables_schema_text_equal(prepared_pair):
    """Word for word (the reference indents differently), with sqlite's own index of the UNIQUE
    key. Ours built that index at the end (the first shard's keys do not ascend: every fifth is
    a long ``deep/...`` name) and then recorded it as the table's own."""
    _, ours, theirs = prepared_pair

    def entries(root):
        db = sqlite3.connect(root / ".nv-meta" / "index.sqlite")
        rows = db.execute(
            "SELECT type, name, tbl_name, sql FROM sqlite_master "
            "WHERE tbl_name IN ('samples', 'sample_parts')"
        )
        return {(*row[:3], row[3] and " ".join(row[3].split())) for row in rows}

    assert ("index", "sqlite_autoindex_samples_1", "samples", None) in entries(theirs)
    assert entries(theirs) <= entries(ours)


REF_LOOKUP_SCRIPT = """
import json, sys
from megatron.energon.epathlib import EPath
from megatron.energon.flavors.webdataset.indexing import SqliteIndexReader
reader = SqliteIndexReader(EPath(sys.argv[1]))
found = {}
for key in json.loads(sys.stdin.read()):
    pointer = reader.get_sample_pointer_by_key(key)
    found[key] = [pointer.tar_file_id, pointer.byte_offset, pointer.byte_size]
print(json.dumps(found))
"""


def test_reference_finds_every_key_in_our_index(prepared_pair, ref_python):
    """The reference's own reader looks every key up through our index (what its joins and
    key lookups do) and finds each where our rows say it is."""
    _, ours, _ = prepared_pair
    db_path = ours / ".nv-meta" / "index.sqlite"
    rows = sqlite3.connect(db_path).execute(
        "SELECT sample_key, tar_file_id, byte_offset, byte_size FROM samples"
    )
    expected = {key: [tar, offset, size] for key, tar, offset, size in rows}
    script = REF_LOOKUP_SCRIPT.replace("sys.argv[1]", repr(str(db_path)))
    out = _run_ref(ref_python, script=script, stdin=json.dumps(sorted(expected)))
    assert expected and json.loads(out.strip().splitlines()[-1]) == expected


def test_our_loader_reads_reference_prepared_dataset_every_sample_once(prepared_pair):
    from energon import WorkerConfig, get_loader, get_val_dataset

    expected, _, theirs = prepared_pair
    captions = {k: p["txt"].decode() for samples in expected.values() for k, p in samples.items()}
    seen = []
    for split_part in ("train", "val", "test"):
        wc = WorkerConfig(rank=0, world_size=1, num_workers=2)
        loader = get_loader(
            get_val_dataset(theirs, split_part=split_part, worker_config=wc, batch_size=None)
        )
        for sample in loader:
            assert sample.caption == captions[sample.__key__]
            assert sample.image.shape[0] == 3
            seen.append(sample.__key__)
    assert sorted(seen) == sorted(captions)


# ---- the interactive prepare assistant -----------------------------------------------------


def _run_ours(*args: str, stdin: str) -> str:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    cmd = [sys.executable, "-c", "from energon.cli.main import main; main()", *args]
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=600, env=env, cwd="/", input=stdin
    )
    assert proc.returncode == 0, f"energon failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def test_interactive_prepare_numbers_sample_types_as_the_reference(ref_python, tmp_path):
    """Megatron-LM's docs tell users to answer "9 (VQASample)": both tools must write VQASample."""
    answers = "1,0,0\ny\n9\ny\npng\ntxt\n\n\n"  # split, dataset.yaml?, type, field map?, fields
    written = {}
    for name, run in (
        ("ours", lambda *a: _run_ours(*a, stdin=answers)),
        ("theirs", lambda *a: _run_ref(ref_python, *a, stdin=answers)),
    ):
        root = tmp_path / name
        write_tar(
            root / "data-0.tar", [(f"{k:04d}.{p}", b"x") for k in range(3) for p in ("png", "txt")]
        )
        out = run("prepare", str(root))
        assert "9. VQASample" in out
        written[name] = yaml.safe_load((root / ".nv-meta" / "dataset.yaml").read_text())
    assert written["ours"] == written["theirs"]
    assert written["ours"] == {
        "sample_type": {"__module__": "megatron.energon", "__class__": "VQASample"},
        "field_map": {"image": "png", "context": "txt"},
    }
