"""``energon prepare`` / ``info`` / ``lint`` on ``s3://`` datasets, against moto on loopback.

Raw shards are uploaded, prepared remotely through the CLI, then loaded via ``s3://``; the uploaded
metadata must equal what a local prepare of the same shards writes.
"""

from __future__ import annotations

import json
import shutil

import boto3
import pytest
from click.testing import CliRunner

from energon import WorkerConfig, get_loader, get_val_dataset
from energon.cli.info import command as info_command
from energon.cli.lint import command as lint_command
from energon.cli.prepare import command as prepare_command
from energon.cli.preview import command as preview_command
from energon.demo import write_text_shards
from energon.remote import s3
from tests.helpers.datasets import upload_to_s3

pytest.importorskip("moto.server")

BUCKET = "energon-prepare-test"
PREPARE_ARGS = [
    "--non-interactive",
    "--split-ratio",
    "2,1,1",
    "--no-progress",
    "--sample-type",
    "TextSample",
    "--field-map",
    '{"text": "txt"}',
]


pytestmark = pytest.mark.usefixtures("fake_aws_env")  # moto server: tests/conftest.py


def _keys_on_s3(url_prefix: str) -> list[str]:
    bucket, prefix = s3.split_url(url_prefix)
    page = boto3.client("s3").list_objects_v2(Bucket=bucket, Prefix=prefix + "/")
    return sorted(item["Key"][len(prefix) + 1 :] for item in page.get("Contents", []))


def _get(url: str) -> bytes:
    bucket, key = s3.split_url(url)
    return boto3.client("s3").get_object(Bucket=bucket, Key=key)["Body"].read()


@pytest.fixture()
def raw_and_local(tmp_path):
    """Raw (unprepared) shards, and a locally prepared copy of the same shards."""
    raw = tmp_path / "raw"
    shards = write_text_shards(raw, num_samples=40, num_shards=4, min_chars=5, max_chars=40)
    local = tmp_path / "local"
    shutil.copytree(raw, local)
    result = CliRunner().invoke(prepare_command, [str(local), *PREPARE_ARGS])
    assert result.exit_code == 0, result.output
    return raw, local, shards


@pytest.mark.parametrize("num_workers", [1, 2])
def test_remote_prepare_matches_local_and_loads(raw_and_local, tmp_path, num_workers):
    raw, local, shards = raw_and_local
    url = f"s3://{BUCKET}/ds{num_workers}"
    upload_to_s3(raw, url)
    result = CliRunner().invoke(
        prepare_command,
        [
            url,
            *PREPARE_ARGS,
            "--num-workers",
            str(num_workers),
            "--tmp-path",
            str(tmp_path / "stage"),
        ],
    )
    assert result.exit_code == 0, result.output
    # no temporary objects left behind, every index next to its shard
    keys = _keys_on_s3(url)
    assert not [k for k in keys if k.endswith(".tmp")], keys
    for name in (".info.json", "split.yaml", "index.sqlite", "index.uuid", "dataset.yaml"):
        assert f".nv-meta/{name}" in keys
    local_meta = local / ".nv-meta"
    assert json.loads(_get(f"{url}/.nv-meta/.info.json")) == json.loads(
        (local_meta / ".info.json").read_text()
    )
    for name in ("split.yaml", "dataset.yaml"):
        assert _get(f"{url}/.nv-meta/{name}") == (local_meta / name).read_bytes()
    for shard in shards:
        assert _get(f"{url}/{shard}.idx") == (local / f"{shard}.idx").read_bytes()
    # the staging folder is cleaned up
    assert not any((tmp_path / "stage").iterdir())

    # load every split through s3://: each sample exactly once
    expected = {}
    wc = WorkerConfig(rank=0, world_size=1, num_workers=0)
    for split in ("train", "val", "test"):
        ds = get_val_dataset(local, split_part=split, worker_config=wc, batch_size=None)
        expected.update({s.__key__: s.text for s in get_loader(ds)})
    seen = []
    for split in ("train", "val", "test"):
        ds = get_val_dataset(url, split_part=split, worker_config=wc, batch_size=None)
        seen += [(s.__key__, s.text) for s in get_loader(ds)]
    assert len(seen) == 40
    assert dict(seen) == expected
    assert len({k for k, _ in seen}) == 40


def test_remote_info_lint_and_overwrite_guard(raw_and_local):
    raw, _, _ = raw_and_local
    url = f"s3://{BUCKET}/info"
    upload_to_s3(raw, url)
    runner = CliRunner()
    result = runner.invoke(prepare_command, [url, *PREPARE_ARGS, "--num-workers", "1"])
    assert result.exit_code == 0, result.output
    info = runner.invoke(info_command, [url])
    assert info.exit_code == 0, info.output
    assert "Total samples: 40 samples" in info.output
    assert "Shards: 4 shards" in info.output
    assert "TextSample" in info.output
    assert "train: 50.00%" in info.output
    lint = runner.invoke(lint_command, [url])
    assert lint.exit_code == 0, lint.output
    assert "train: 20 samples loaded, 0 failed" in lint.output
    # already prepared: refused without --force-overwrite, and the metadata is left as it was
    before = _get(f"{url}/.nv-meta/index.uuid")
    again = runner.invoke(prepare_command, [url, *PREPARE_ARGS])
    assert again.exit_code != 0
    assert "already been prepared" in again.output
    assert _get(f"{url}/.nv-meta/index.uuid") == before
    preview = runner.invoke(
        preview_command, [url, "--split-parts", "train", "--num-samples", "1"], input="n\n"
    )
    assert preview.exit_code == 0, preview.output
    assert "Split train: 20 samples" in preview.output
    # --tar-index-only rebuilds the indices and index.sqlite; info and split stay unchanged
    info_before = _get(f"{url}/.nv-meta/.info.json")
    split_before = _get(f"{url}/.nv-meta/split.yaml")
    rebuilt = runner.invoke(prepare_command, [url, "--tar-index-only", "--no-progress"])
    assert rebuilt.exit_code == 0, rebuilt.output
    assert _get(f"{url}/.nv-meta/index.uuid") != before
    assert _get(f"{url}/.nv-meta/.info.json") == info_before
    assert _get(f"{url}/.nv-meta/split.yaml") == split_before


def test_interrupted_remote_prepare_keeps_the_old_metadata(raw_and_local, monkeypatch):
    raw, _, shards = raw_and_local
    url = f"s3://{BUCKET}/interrupted"
    upload_to_s3(raw, url)
    runner = CliRunner()
    assert runner.invoke(prepare_command, [url, *PREPARE_ARGS, "--num-workers", "1"]).exit_code == 0
    before = {k: _get(f"{url}/{k}") for k in _keys_on_s3(url) if k.startswith(".nv-meta/")}

    # re-prepare with other splits; the upload dies at index.sqlite (after the tar indices)
    from energon.prepare import dataset as prepare_module

    real_upload = prepare_module.epath.upload

    def dying_upload(local: str, target: str) -> None:
        if target.endswith("index.sqlite"):
            raise KeyboardInterrupt("simulated interruption")
        real_upload(local, target)

    monkeypatch.setattr(prepare_module.epath, "upload", dying_upload)
    args = [url, *PREPARE_ARGS, "--num-workers", "1", "--force-overwrite"]
    args[args.index("2,1,1")] = "1,1,0"
    result = runner.invoke(prepare_command, args)
    assert result.exit_code != 0
    keys = _keys_on_s3(url)
    assert not [k for k in keys if k.endswith(".tmp")], keys
    after = {k: _get(f"{url}/{k}") for k in keys if k.startswith(".nv-meta/")}
    assert after == before  # the old metadata, complete and untouched
    wc = WorkerConfig(rank=0, world_size=1, num_workers=0)
    ds = get_val_dataset(url, split_part="train", worker_config=wc, batch_size=None)
    assert len(list(get_loader(ds))) == 20  # still the old 2:1:1 split


def test_remote_prepare_of_a_broken_shard_uploads_nothing(tmp_path):
    raw = tmp_path / "raw"
    shards = write_text_shards(raw, num_samples=12, num_shards=2, min_chars=5, max_chars=40)
    broken = raw / shards[1]
    broken.write_bytes(broken.read_bytes()[:700])  # cut inside a member
    url = f"s3://{BUCKET}/broken"
    upload_to_s3(raw, url)
    result = CliRunner().invoke(prepare_command, [url, *PREPARE_ARGS, "--num-workers", "2"])
    assert result.exit_code != 0
    assert shards[1] in result.output  # the error names the shard
    assert _keys_on_s3(url) == sorted(shards)  # no .nv-meta, no index, no temporary object
