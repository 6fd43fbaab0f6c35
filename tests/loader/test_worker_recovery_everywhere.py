"""Lost workers are replaced the same way whatever the pipeline (issue 40, point 5): validation,
packing, grouping, blends, joins and compute-balanced steps. Each configuration runs once without
workers, skipping the poison sample (the reference), and once with a worker that is killed on it:
the batches must be the same, batch for batch."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from energon import TextSample, WorkerConfig, get_savable_loader, get_train_dataset, get_val_dataset
from energon.balance import Balance
from energon.cli.main import cli
from energon.demo.vlm import write_vlm_shards
from tests.helpers.datasets import make_text_dataset
from tests.helpers.poison import Poison, PoisonGroups, PoisonPacker, PoisonVlm

BATCHES = 12


def _quiet(*_args):
    pass


def joined_text(primary, secondary):
    return TextSample.derive_from(primary, text=primary.text + "|" + secondary.text)


@pytest.fixture(scope="module")
def roots(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("recovery")
    make_text_dataset(root / "a", num_samples=60, num_shards=3)
    make_text_dataset(root / "b", num_samples=60, num_shards=3, seed=3)  # the same keys
    make_text_dataset(
        root / "v", num_samples=60, num_shards=3, split=(("train", 0.5), ("val", 0.5))
    )
    write_vlm_shards(root / "vlm", num_samples=80, num_shards=2, seed=3, text_median_chars=300)
    (root / "blend.yaml").write_text(
        "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    blend:\n"
        "      - weight: 2\n        path: ./a\n      - weight: 1\n        path: ./b\n"
    )
    (root / "join.yaml").write_text(
        "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    join:\n"
        "      - path: ./a\n      - path: ./b\n        nonmatch: error\n    joiner:\n"
        f"      __module__: {joined_text.__module__}\n      __function__: joined_text\n"
    )
    assert CliRunner().invoke(cli, ["prepare", str(root / "join.yaml")]).exit_code == 0
    return root


def _config(name, root):
    """(path, task encoder class, options, validation?) of a configuration."""
    plain = dict(batch_size=4, shuffle_buffer_size=6, max_samples_per_sequence=6)
    return {
        "validation": (root / "v", Poison, dict(batch_size=4, split_part="val"), True),
        "packing": (
            root / "a",
            PoisonPacker,
            dict(plain, batch_size=2, packing_buffer_size=8),
            False,
        ),
        "grouping": (root / "a", PoisonGroups, dict(plain, batch_size=None), False),
        "blend": (root / "blend.yaml", Poison, plain, False),
        "join": (root / "join.yaml", Poison, plain, False),
        "balanced": (
            root / "vlm",
            PoisonVlm,
            dict(plain, batch_size=5, balance=Balance(max_length=4096, window=4)),
            False,
        ),
    }[name]


def _keys(batch) -> list:
    if hasattr(batch, "samples"):  # a balanced batch
        return [s.__key__ for s in batch.samples]
    return list(batch.__key__)


def _flat(keys) -> list[str]:
    """Sample keys, one by one (a packed sequence's key joins its members' with commas)."""
    if isinstance(keys, str):
        return keys.split(",")
    return [k for key in keys for k in _flat(key)]


def _run(config, num_workers, te) -> tuple[list, object]:
    path, _, options, validation = config
    wc = WorkerConfig(rank=0, world_size=1, num_workers=num_workers, global_error_handler=_quiet)
    make = get_val_dataset if validation else get_train_dataset
    ds = make(str(path), worker_config=wc, task_encoder=te, num_streams=2, **options)
    loader = get_savable_loader(ds)
    return [_keys(b) for _, b in zip(range(BATCHES), loader)], loader


@pytest.mark.parametrize("name", ["validation", "packing", "grouping", "blend", "join", "balanced"])
def test_a_killed_worker_is_replaced_in_every_kind_of_pipeline(roots, name):
    config = _config(name, roots)
    encoder = config[1]
    clean, _ = _run(config, 0, encoder())
    key = _flat(clean[3])[0]
    expected, _ = _run(config, 0, encoder([key]))
    got, loader = _run(config, 1, encoder([key], "sigkill"))
    # (a blend of two datasets with the same keys meets the key once in each; packed samples
    # are few per batch, and a stream that starts its next epoch meets the key again)
    losses = loader.worker_losses()
    seen = f"losses: {losses}; errors: {loader.error_report()}"  # printed if an assert fails
    assert got == expected, seen
    assert key in _flat(clean) and key not in _flat(got)
    assert losses
    assert all(loss["sample"]["key"] == key for loss in losses), seen
    assert all(loss["action"] == "replaced; sample skipped" for loss in losses), seen
    # (a skip is counted once its stream delivered an item after it)
    assert 1 <= loader.error_report()["skipped"] <= len(losses), seen


def test_a_replacement_lost_before_it_sent_anything_still_skips_the_first_sample(
    roots, monkeypatch
):
    """A replacement that dies before its first message (its items still in an unsent group)
    is replaced from the same resume point: the sample skipped for the first loss must still be
    skipped then, not met again (found in CI on a busy machine, where groups grow)."""
    monkeypatch.setattr("energon.loader.workers.messages.GROUP_SECONDS", 3600.0)  # 8 per group
    config = _config("blend", roots)
    clean, _ = _run(config, 0, Poison())
    key = _flat(clean[3])[0]
    expected, _ = _run(config, 0, Poison([key]))
    got, loader = _run(config, 1, Poison([key], "sigkill"))
    losses = loader.worker_losses()
    assert got == expected, losses
    places = [(loss["sample"]["dataset"], loss["sample"]["index"]) for loss in losses]
    assert len(places) == len(set(places)) >= 2, losses  # each poison sample met once
