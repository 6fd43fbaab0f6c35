"""Every mapped reference module path imports through the alias as exactly one energon module
(``megatron.energon.X is <that module>``), so classes and ``isinstance`` agree under both names."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from energon.compat.modules import REFERENCE_MODULES, energon_module_for
from tests.helpers.paths import REPO_ROOT

# What the issue names explicitly, each with one object that must be importable from it.
REQUIRED = {
    "epathlib": ["EPath", "DEFAULT_PROFILE_NAME"],
    "epathlib.epath": ["EPath"],
    "flavors": ["BaseWebdatasetFactory", "CaptioningSample"],
    "flavors.webdataset": ["DefaultDecoderWebdatasetFactory"],
    "flavors.webdataset.config": ["MAIN_FOLDER_NAME", "SPLIT_YAML_FILENAME"],
    "flavors.webdataset.sample_decoder": ["SampleDecoder"],
    "flavors.webdataset.indexing": ["SqliteIndexWriter", "DuplicateSampleKeyError"],
    "wrappers": ["MapDataset", "BlendDataset"],
    "wrappers.watchdog_dataset": ["WatchdogDataset"],
    "cache": ["FileStoreCachePool"],
    "cache.base": ["CachePool", "Lazy"],
    "dataset_config": ["get_dataset_from_config"],
    "metadataset": ["load_dataset"],
    "metadataset.loader": ["load_dataset", "prepare_metadataset"],
    "metadataset.loader_interface": ["DatasetBlendMode", "LoadedDataset"],
    "metadataset.metadataset_v2": ["AuxFilesystemReference"],
    "task_encoder": ["DefaultTaskEncoder"],
    "task_encoder.base": ["stateless", "TaskEncoder"],
    "task_encoder.cooking": ["Cooker", "basic_sample_keys"],
    "savable_loader": ["SavableDataLoader", "BasicDataLoader"],
    "loader": ["get_loader", "get_savable_loader"],
    "av": ["AVDecoder", "get_clips_uniform"],
    "av.av_reader": ["AVProbeIndex"],
    "media": ["AVMetadata", "ImageMetadata"],
    "media.filesystem_prepare": ["prepare_filesystem_dataset"],
    "source_info": ["SourceInfo"],
    "sample_utils": ["format_sample_compact", "format_sample_detailed", "default_get_batch_keys"],
    "errors": ["FatalSampleError", "ErrorContext", "SYSTEM_EXCEPTIONS", "handle_restore_errors"],
    "edataclass": ["edataclass"],
    "tools.prepare": ["command"],
    "tools.info": ["command"],
    "tools.lint": ["command"],
    "tools.preview": ["command"],
    "tools.checkpoint": ["command"],
    "tools.analyze_debug": ["command"],
    "cli.main": ["main"],
    "transforms": ["MergeTransform", "CustomTransform", "TransformMapper"],
    "transforms.mappers": ["ResizeMapper", "RandomPerspectiveMapper"],
    "transforms.custom": ["CustomTransform"],
    "transforms.merge": ["MergeTransform"],
}

CHECK = r"""
import importlib, json, sys
import energon.megatron_alias
paths, required = json.loads(sys.argv[1]), json.loads(sys.argv[2])
out = {}
for suffix, target in paths.items():
    name = "megatron.energon" + ("." + suffix if suffix else "")
    try:
        module = importlib.import_module(name)
        same = module is importlib.import_module(target) and sys.modules[name] is module
        names = required.get(suffix, [])
        missing = [n for n in names if getattr(module, n, None) is None]
        exec(f"from {name} import " + ", ".join(names)) if names else None
        out[suffix] = "ok" if same and not missing else f"same={same} missing={missing}"
    except Exception as e:
        out[suffix] = f"{type(e).__name__}: {e}"
print("PATHS" + json.dumps(out))
"""


@pytest.fixture(scope="module")
def resolved() -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    proc = subprocess.run(
        [sys.executable, "-c", CHECK, json.dumps(REFERENCE_MODULES), json.dumps(REQUIRED)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    line = next((x for x in proc.stdout.splitlines() if x.startswith("PATHS")), None)
    assert line is not None, proc.stderr[-3000:]
    return json.loads(line[len("PATHS") :])


def test_required_paths_are_mapped():
    assert set(REQUIRED) <= set(REFERENCE_MODULES)


@pytest.mark.parametrize("suffix", sorted(REFERENCE_MODULES))
def test_module_path_resolves_to_one_energon_module(resolved, suffix):
    assert resolved[suffix] == "ok"


def test_unmapped_paths_are_not_found():
    assert energon_module_for("megatron.energon.no_such_module") is None
    assert energon_module_for("somethingelse.energon") is None
    assert energon_module_for("megatron.energon") == "energon.compat.megatron_energon"
