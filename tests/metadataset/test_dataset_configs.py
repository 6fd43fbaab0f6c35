"""The example metadatasets in dataset_configs/ load as documented."""

from __future__ import annotations

import shutil
import warnings
from collections import Counter

import pytest
from click.testing import CliRunner

from energon import (
    Cooker,
    TextSample,
    WorkerConfig,
    basic_sample_keys,
    get_savable_loader,
    get_train_dataset,
    get_val_dataset,
    stateless,
)
from energon.cli.main import cli
from energon.task_encoder import DefaultTaskEncoder
from tests.helpers.datasets import make_captioning_dataset, make_text_dataset
from tests.helpers.paths import DATASET_CONFIGS

CONFIGS = DATASET_CONFIGS
SPLIT = (("train", 0.6), ("val", 0.2), ("test", 0.2))


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    root = tmp_path_factory.mktemp("configs")
    make_text_dataset(root / "texts", num_samples=100, num_shards=5, split=SPLIT)
    make_text_dataset(root / "texts_b", num_samples=100, num_shards=5, split=SPLIT, seed=2)
    crude = make_captioning_dataset(root / "crude_images", num_samples=12, num_shards=2)
    (crude / ".nv-meta" / "dataset.yaml").write_text(
        "__module__: megatron.energon\n__class__: CrudeWebdataset\n"
    )
    (root / "extra").mkdir()
    for f in CONFIGS.glob("*.yaml"):
        shutil.copy(f, root / f.name)
    return root


def take(path, n, **kwargs):
    wc = WorkerConfig(rank=0, world_size=1, num_workers=0)
    options = dict(batch_size=None, shuffle_buffer_size=None, max_samples_per_sequence=None)
    options.update(kwargs)
    it = iter(get_savable_loader(get_train_dataset(path, worker_config=wc, **options)))
    return [next(it) for _ in range(n)]


def val(path, **kwargs):
    wc = WorkerConfig(rank=0, world_size=1, num_workers=0)
    return list(
        get_savable_loader(get_val_dataset(path, worker_config=wc, batch_size=None, **kwargs))
    )


def test_blend(workspace):
    got = take(workspace / "blend.yaml", 400)
    share = Counter(s.__subflavors__["source"] for s in got)
    assert abs(share["texts"] - 300) <= 2
    assert len(val(workspace / "blend.yaml")) == 40


def test_blend_epochized(workspace):
    got = take(workspace / "blend_epochized.yaml", 150, repeat=False)
    assert len(got) == 150  # 60 x 2 + 60 x 0.5


def test_join(workspace):
    result = CliRunner().invoke(cli, ["prepare", str(workspace / "join.yaml")])
    assert result.exit_code == 0, result.output
    joined = take(workspace / "join.yaml", 5)
    plain_b = {s.__key__: s.text for s in val(workspace / "texts_b", split_part="train")}
    assert all(s.text == plain_b[s.__key__] for s in joined)  # the later member's field wins


def test_nested_subsets(workspace):
    got = take(workspace / "nested_subsets.yaml", 200)
    assert {s.__subflavors__["stage"] for s in got} == {"pretrain"}
    assert "texts_b_head" in {s.__subflavors__["source"] for s in got}
    assert len(val(workspace / "nested_subsets.yaml")) == 12


@stateless
def cook(sample, extra):
    return TextSample(**basic_sample_keys(sample), text=sample["txt"])


class Encoder(DefaultTaskEncoder):
    cookers = [Cooker(cook, has_subflavors={"kind": "crude"})]


def test_aux(workspace):
    got = val(workspace / "aux.yaml", split_part="train", task_encoder=Encoder())
    assert len(got) == 12 and all(isinstance(s, TextSample) for s in got)


def test_megatron_v1(workspace):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = take(workspace / "megatron_v1.yaml", 100)
    assert abs(sum(s.__subflavors__["augmentation"] for s in got) - 30) <= 2
    assert len(val(workspace / "megatron_v1.yaml")) == 20
