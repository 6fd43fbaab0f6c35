"""``energon prepare`` through click's test runner: the assistant and the scripted mode."""

from __future__ import annotations

import json

import pytest
import yaml
from click.testing import CliRunner

from energon.cli.main import cli
from energon.cli.prepare import available_sample_types, parse_split_ratio
from energon.format.info import read_info
from energon.format.split import read_split
from energon.prepare.dataset import prepare_dataset
from tests.helpers.tarfiles import make_captioning_shards


def _run(args, input=None):
    return CliRunner().invoke(cli, args, input=input, catch_exceptions=False)


def _dataset_yaml(root, name="dataset.yaml"):
    return yaml.safe_load((root / ".nv-meta" / name).read_text())


@pytest.fixture
def shards(tmp_path):
    make_captioning_shards(tmp_path, (30, 20), with_json=True)
    return tmp_path


def test_interactive_wizard_on_prepared_dataset(shards):
    prepare_dataset(shards, progress=False)
    result = _run(["prepare", str(shards)], input="y\n1,0,0\ny\n0\nY\npng\ntxt\n")
    assert result.exit_code == 0, result.output
    assert "It seems the dataset had already been prepared" in result.output
    assert "0. CaptioningSample" in result.output
    assert '"caption": "caption 0"' in result.output  # JSON preview of the first sample
    assert _dataset_yaml(shards) == {
        "sample_type": {"__module__": "megatron.energon", "__class__": "CaptioningSample"},
        "field_map": {"image": "png", "caption": "txt"},
    }
    assert read_split(shards).split_parts["train"] == ["parts/data-0.tar", "parts/data-1.tar"]
    assert result.output.rstrip().endswith("Done")


def test_interactive_reasks_invalid_answers(shards):
    answers = "1,2\n8,1,1\ny\n99\n0\nY\nwebp\npng\ntxt,json[caption]\n"
    result = _run(["prepare", str(shards), "--no-progress"], input=answers)
    assert result.exit_code == 0, result.output
    assert "Invalid split" in result.output
    assert "Invalid choice 99" in result.output
    assert "Unknown part type(s) ['webp']" in result.output
    assert _dataset_yaml(shards)["field_map"] == {"image": "png", "caption": "txt,json[caption]"}


def test_interactive_declines_on_prepared_dataset(shards):
    prepare_dataset(shards, progress=False)
    before = (shards / ".nv-meta" / ".info.json").read_text()
    result = _run(["prepare", str(shards)], input="n\n")
    assert result.exit_code == 0
    assert (shards / ".nv-meta" / ".info.json").read_text() == before


def test_interactive_sample_loader_choice(shards):
    result = _run(["prepare", str(shards)], input="1,0,0\ny\n8\nn\n")  # TextSample, sample loader
    assert result.exit_code == 0, result.output
    content = _dataset_yaml(shards)
    assert content["sample_type"]["__class__"] == "TextSample"
    assert content["sample_loader"] == "sample_loader.py:sample_loader"
    assert 'text=raw["TODO"]' in (shards / ".nv-meta" / "sample_loader.py").read_text()


def test_interactive_crude_choice(shards):
    result = _run(["prepare", str(shards)], input="1,0,0\ny\n11\n")  # the reference's number
    assert result.exit_code == 0, result.output
    assert _dataset_yaml(shards) == {
        "__module__": "megatron.energon",
        "__class__": "CrudeWebdataset",
    }
    assert "Cooker" in result.output


def test_non_interactive_full(shards):
    result = _run(
        [
            "prepare",
            str(shards),
            "--non-interactive",
            "--split-ratio",
            "1,1,0",
            "--sample-type",
            "CaptioningSample",
            "--field-map",
            json.dumps({"image": "png", "caption": "json[caption]"}),
            "--dataset-yaml-name",
            "captions.yaml",
            "--num-workers",
            "2",
        ]
    )
    assert result.exit_code == 0, result.output
    assert _dataset_yaml(shards, "captions.yaml")["field_map"] == {
        "image": "png",
        "caption": "json[caption]",
    }
    split = read_split(shards).split_parts
    assert split == {"train": ["parts/data-0.tar"], "val": ["parts/data-1.tar"], "test": []}


def test_non_interactive_without_sample_type_skips_dataset_yaml(shards):
    result = _run(["prepare", str(shards), "--non-interactive", "--split-ratio", "8,1,1"])
    assert result.exit_code == 0, result.output
    assert "Skipping dataset.yaml creation" in result.output
    assert not (shards / ".nv-meta" / "dataset.yaml").exists()
    assert read_info(shards) == {"parts/data-0.tar": 30, "parts/data-1.tar": 20}


def test_non_interactive_sample_type_without_field_map_writes_loader(shards):
    (shards / ".nv-meta").mkdir()
    (shards / ".nv-meta" / "sample_loader.py").write_text("# keep me\n")
    result = _run(
        [
            "prepare",
            str(shards),
            "--non-interactive",
            "--split-ratio",
            "1,0,0",
            "--sample-type",
            "TextSample",
        ]
    )
    assert result.exit_code == 0, result.output
    assert _dataset_yaml(shards)["part_filter"] == "sample_loader.py:part_filter"
    assert (shards / ".nv-meta" / "sample_loader.py").read_text() == "# keep me\n"


def test_non_interactive_on_prepared_dataset_needs_force(shards):
    prepare_dataset(shards, progress=False)
    result = _run(["prepare", str(shards), "--non-interactive", "--split-ratio", "1,0,0"])
    assert result.exit_code == 1
    assert "Use --force-overwrite to overwrite" in result.output
    forced = _run(
        ["prepare", str(shards), "--non-interactive", "--split-ratio", "0,1,0", "--force-overwrite"]
    )
    assert forced.exit_code == 0, forced.output
    assert read_split(shards).split_parts["val"] == ["parts/data-0.tar", "parts/data-1.tar"]


def test_split_parts_and_exclude_options(shards):
    result = _run(
        [
            "prepare",
            str(shards),
            "--non-interactive",
            "--split-parts",
            "train:parts/data-0",
            "--split-parts",
            "val:parts/data-{1,2}",
            "--skip-dataset-yaml",
        ]
    )
    assert result.exit_code == 0, result.output
    assert read_split(shards).split_parts == {
        "train": ["parts/data-0.tar"],
        "val": ["parts/data-1.tar"],
    }
    excluded = _run(
        [
            "prepare",
            str(shards),
            "--non-interactive",
            "--force-overwrite",
            "--split-ratio",
            "1,0,0",
            "--exclude",
            "data-1",
        ]
    )
    assert excluded.exit_code == 0
    assert read_info(shards) == {"parts/data-0.tar": 30}


def test_shuffle_tars_uses_seed_42(shards):
    result = _run(
        ["prepare", str(shards), "--non-interactive", "--split-ratio", "1,0,0", "--shuffle-tars"]
    )
    assert result.exit_code == 0
    assert read_split(shards).split_parts["train"] == ["parts/data-1.tar", "parts/data-0.tar"]


def test_bad_options_are_usage_errors(shards):
    assert _run(["prepare", str(shards), "--non-interactive"]).exit_code == 2  # no split given
    assert (
        _run(["prepare", str(shards), "--non-interactive", "--split-ratio", "1,1"]).exit_code == 2
    )
    bad_type = _run(
        [
            "prepare",
            str(shards),
            "--non-interactive",
            "--split-ratio",
            "1,0,0",
            "--sample-type",
            "Nope",
        ]
    )
    assert bad_type.exit_code == 2 and "CaptioningSample" in bad_type.output
    bad_map = _run(
        ["prepare", str(shards), "--non-interactive", "--force-overwrite", "--split-ratio", "1,0,0"]
        + ["--sample-type", "TextSample", "--field-map", '{"nofield": "txt"}']
    )
    assert bad_map.exit_code == 2 and "not fields of TextSample" in bad_map.output
    media = _run(
        ["prepare", str(shards), "--media-metadata-by-extension", "--media-metadata-by-header"]
    )
    assert media.exit_code == 2, "two media metadata strategies at once are a usage error"


def test_prepare_failure_is_reported_and_exits_1(shards):
    (shards / "parts/data-1.tar").write_bytes((shards / "parts/data-1.tar").read_bytes()[:700])
    result = _run(["prepare", str(shards), "--non-interactive", "--split-ratio", "1,0,0"])
    assert result.exit_code == 1
    assert "data-1.tar" in result.output and "byte offset" in result.output
    assert not (shards / ".nv-meta" / ".info.json").exists()


def test_no_tar_files(tmp_path):
    result = _run(["prepare", str(tmp_path), "--non-interactive", "--split-ratio", "1,0,0"])
    assert result.exit_code == 1 and "Did not find any tar files" in result.output


def test_tar_index_only_cli(shards):
    prepare_dataset(shards, progress=False)
    (shards / "parts/data-1.tar.idx").unlink()
    result = _run(["prepare", str(shards), "--tar-index-only", "--non-interactive"])
    assert result.exit_code == 0, result.output
    assert (shards / "parts/data-1.tar.idx").is_file()


def test_version_and_help():
    version = _run(["-V"])
    assert version.exit_code == 0 and version.output.startswith("energon-loader ")
    helped = _run(["-h"])
    assert helped.exit_code == 0 and "prepare" in helped.output and "info" in helped.output
    assert "--split-ratio" in _run(["prepare", "-h"]).output


def test_parse_split_ratio():
    assert parse_split_ratio("8, 1,1") == [("train", 8.0), ("val", 1.0), ("test", 1.0)]
    for bad in ("1,2", "a,b,c", "0,0,0", "-1,1,1"):
        with pytest.raises(ValueError):
            parse_split_ratio(bad)


def test_menu_numbers_the_reference_types_first_then_crude_then_ours(shards):
    """The reference's numbering (Megatron-LM's docs: "9 (VQASample)"); energon-only types after."""
    result = _run(["prepare", str(shards)], input="1,0,0\ny\n9\nY\npng\ntxt\n\n\n")
    assert result.exit_code == 0, result.output
    menu = [line for line in result.output.splitlines() if line[:1].isdigit() and ". " in line]
    assert menu[:12] == [
        "0. CaptioningSample",
        "1. ImageClassificationSample",
        "2. ImageSample",
        "3. InterleavedSample",
        "4. MultiChoiceVQASample",
        "5. OCRSample",
        "6. Sample",
        "7. SimilarityInterleavedSample",
        "8. TextSample",
        "9. VQASample",
        "10. VidQASample",
        "11. Crude sample (plain dict for cooking)",
    ]
    assert menu[12:] == ["12. VQAOCRSample"]
    assert _dataset_yaml(shards)["sample_type"]["__class__"] == "VQASample"
    assert _dataset_yaml(shards)["field_map"] == {"image": "png", "context": "txt"}


def test_sample_types_come_from_the_samples_package():
    from energon.samples import EXTRA_SAMPLE_TYPES, REFERENCE_SAMPLE_TYPES

    specs = available_sample_types()
    assert [s.name for s in specs] == [
        c.__name__ for c in REFERENCE_SAMPLE_TYPES + EXTRA_SAMPLE_TYPES
    ]
    vqa = specs[[s.name for s in specs].index("VQASample")]
    assert [(f.name, f.default) for f in vqa.fields] == [
        ("image", None),
        ("context", None),
        ("answers", "None"),
        ("answer_weights", "None"),
    ]
