"""``energon info``: summary of a prepared dataset, including crude class-style datasets (S11)."""

from __future__ import annotations

from click.testing import CliRunner

from energon.cli.info import format_size
from energon.cli.main import cli
from energon.format.dataset_yaml import (
    crude_dataset_yaml,
    field_map_dataset_yaml,
    write_dataset_yaml,
)
from energon.prepare.dataset import prepare_dataset
from tests.helpers.tarfiles import make_captioning_shards


def _info(path, *extra):
    return CliRunner().invoke(cli, ["info", str(path), *extra], catch_exceptions=False)


def test_info_reports_counts_size_splits_and_type(tmp_path):
    make_captioning_shards(tmp_path, (30, 20))
    prepare_dataset(
        tmp_path, split_parts_ratio=[("train", 1), ("val", 1), ("test", 0)], progress=False
    )
    write_dataset_yaml(
        tmp_path, field_map_dataset_yaml("CaptioningSample", {"image": "png", "caption": "txt"})
    )
    result = _info(tmp_path)
    assert result.exit_code == 0, result.output
    out = result.output
    assert str(tmp_path) in out
    assert "50 samples" in out and "2 shards" in out
    assert "Sample type: CaptioningSample" in out
    size = sum((tmp_path / f"parts/data-{i}.tar").stat().st_size for i in range(2))
    assert f"Total size: {format_size(size)}" in out
    assert "* train: 60.00% (30 samples, 1 shards)" in out
    assert "* val: 40.00% (20 samples, 1 shards)" in out
    assert out.index("* train") < out.index("* val") < out.index("* test")


def test_info_on_crude_dataset_does_not_crash(tmp_path):
    make_captioning_shards(tmp_path, (5,))
    prepare_dataset(tmp_path, progress=False)
    write_dataset_yaml(tmp_path, crude_dataset_yaml())
    result = _info(tmp_path)
    assert result.exit_code == 0, result.output
    assert "crude (CrudeWebdataset" in result.output


def test_info_custom_configs_and_missing_dataset_yaml(tmp_path):
    make_captioning_shards(tmp_path, (3, 4))
    prepare_dataset(tmp_path, progress=False, split_config="other.yaml")
    result = _info(tmp_path, "--split-config", "other.yaml")
    assert result.exit_code == 0, result.output
    assert "7 samples" in result.output and "no dataset.yaml" in result.output


def test_info_on_unprepared_folder_fails_cleanly(tmp_path):
    result = _info(tmp_path)
    assert result.exit_code == 1 and "energon prepare" in result.output


def test_format_size():
    assert format_size(0) == "0.00 B"
    assert format_size(1536) == "1.50 KiB"
    assert format_size(5 * 1024**3) == "5.00 GiB"
    assert format_size(3 * 1024**6) == "3072.00 PiB"
