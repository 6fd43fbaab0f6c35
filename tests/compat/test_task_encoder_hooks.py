"""One class per task-encoder name, and the ``build_*`` hooks as a typed extension point: a task
encoder that overrides none of them keeps energon's pipeline, one that overrides any of them gets
the reference's composition (registered by ``energon.compat``; the core never imports it)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import energon
import energon.task_encoder as core
from energon import BatchDataset, SavableDataset, WorkerConfig, get_loader, get_train_dataset
from energon.compat.wrappers import MapDataset
from energon.task_encoder.composition import BUILD_HOOKS
from tests.helpers.datasets import make_text_dataset
from tests.helpers.paths import REPO_ROOT


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    return make_text_dataset(tmp_path_factory.mktemp("hooks"), num_samples=24, num_shards=2)


def _wc() -> WorkerConfig:
    return WorkerConfig(rank=0, world_size=1, num_workers=0)


def _train(path: Path, task_encoder, batch_size: int | None = 4):
    return get_train_dataset(
        path,
        batch_size=batch_size,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
        worker_config=_wc(),
        task_encoder=task_encoder,
    )


def test_each_task_encoder_name_is_one_class():
    for name in ("TaskEncoder", "DefaultTaskEncoder", "AugmentTaskEncoder"):
        cls = getattr(energon, name)
        assert cls is getattr(core, name)
        assert cls.__module__ == "energon.task_encoder.base"
    code = (
        "import energon.megatron_alias, energon, energon.task_encoder as core\n"
        "import megatron.energon as m, megatron.energon.task_encoder as mt\n"
        "names = ('TaskEncoder', 'DefaultTaskEncoder', 'AugmentTaskEncoder')\n"
        "print(all(getattr(m, n) is getattr(core, n) is getattr(mt, n) for n in names))\n"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "True"


def test_core_task_encoder_declares_the_reference_hooks():
    for hook in BUILD_HOOKS:
        assert callable(getattr(core.TaskEncoder, hook)), hook
    assert not core.DefaultTaskEncoder().composes_pipeline()


def test_no_override_keeps_energons_pipeline(dataset):
    class TE(energon.DefaultTaskEncoder):
        def encode_sample(self, sample):
            return sample.text.upper()

        def batch(self, samples):
            return samples

    ds = _train(dataset, TE())
    assert type(ds) is SavableDataset  # the spec-built pipeline, not a composition
    batch = next(iter(get_loader(ds)))
    assert len(batch) == 4 and all(t == t.upper() for t in batch)


def test_overriding_one_hook_composes_with_the_reference_defaults(dataset):
    """Only ``build_batch`` overridden: the default ``build_train_datasets`` (the reference's,
    reached through the core class) calls it, and ``super().build_batch`` batches."""
    seen = []

    class TE(energon.DefaultTaskEncoder):
        def build_batch(self, dataset, *, batch_size, worker_config, **kwargs):
            seen.append(batch_size)
            batched = super().build_batch(
                dataset, batch_size=batch_size, worker_config=worker_config, **kwargs
            )
            # DefaultTaskEncoder's encode_batch is active: Map(encode_batch) over Batch
            assert isinstance(batched, MapDataset) and isinstance(batched.dataset, BatchDataset)
            return MapDataset(batched, lambda b: len(b.text), worker_config=worker_config)

    ds = _train(dataset, TE(), batch_size=3)
    assert seen == [3]
    assert type(ds) is MapDataset
    it = iter(get_loader(ds))
    assert [next(it) for _ in range(5)] == [3] * 5


def test_composition_without_the_compat_layer_says_how_to_get_it(dataset):
    """A fresh process that only imports the core: a ``build_*`` override fails clearly."""
    code = (
        "import sys\n"
        "from energon.task_encoder import DefaultTaskEncoder\n"
        "from energon.loader import get_train_dataset\n"
        "from energon.worker import WorkerConfig\n"
        "class TE(DefaultTaskEncoder):\n"
        "    def build_encode_sample(self, dataset, *, worker_config):\n"
        "        return dataset\n"
        "try:\n"
        "    get_train_dataset(sys.argv[1], batch_size=2, shuffle_buffer_size=None,\n"
        "        max_samples_per_sequence=None, worker_config=WorkerConfig(rank=0, world_size=1,\n"
        "        num_workers=0), task_encoder=TE())\n"
        "except NotImplementedError as e:\n"
        "    print('energon.compat' in sys.modules, 'energon.compat' in str(e))\n"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    proc = subprocess.run(
        [sys.executable, "-c", code, str(dataset)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["False", "True"]
