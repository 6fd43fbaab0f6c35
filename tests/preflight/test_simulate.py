"""`energon simulate` against real loader runs: epoch lengths, validation counts per rank, blend
proportions, samples per shard and the shuffle figure must match what real loaders deliver."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from click.testing import CliRunner

from energon import (
    WorkerConfig,
    get_loader,
    get_savable_loader,
    get_train_dataset,
    get_val_dataset,
    is_padding,
)
from energon.cli.main import main
from energon.preflight.simulate import SimulationSettings, simulate
from tests.helpers.datasets import make_text_dataset

R, W, B = 3, 1, 4


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("simulate")
    # 230 train (uneven over 3 ranks x 4), 50 val samples
    make_text_dataset(
        root / "a", num_samples=280, num_shards=7, split=(("train", 0.82), ("val", 0.18))
    )
    make_text_dataset(root / "b", num_samples=60, num_shards=3, seed=1)
    make_text_dataset(
        root / "small", num_samples=40, num_shards=4, split=(("train", 0.75), ("val", 0.25))
    )
    (root / "blend.yaml").write_text(
        """
__class__: MetadatasetV2
splits:
  train:
    blend:
      - weight: 3
        path: ./a
      - weight: 1
        path: ./b
"""
    )
    return root


def settings(**kw):
    base = dict(
        world_size=R,
        num_workers=W,
        batch_size=B,
        shuffle_buffer_size=20,
        max_samples_per_sequence=10,
    )
    base.update(kw)
    return SimulationSettings(**base)


def real_train_loaders(path, s):
    loaders = []
    for rank in range(s.world_size):
        wc = WorkerConfig(rank=rank, world_size=s.world_size, num_workers=s.num_workers)
        ds = get_train_dataset(
            path,
            worker_config=wc,
            batch_size=s.batch_size,
            shuffle_buffer_size=s.shuffle_buffer_size,
            max_samples_per_sequence=s.max_samples_per_sequence,
        )
        loaders.append(get_savable_loader(ds))
    return loaders


def global_order(loaders, steps):
    """The samples of the first ``steps`` steps, in global micro-batch order."""
    iters = [iter(ld) for ld in loaders]
    out = []
    for _ in range(steps):
        for it in iters:
            batch = next(it)
            for sources in batch.__sources__:  # per sample: its sources (the first is the data)
                out.append((str(sources[0].dataset_path), sources[0].shard_name))
    return out


def test_train_figures_match_real_loaders(root):
    s = settings()
    sim = simulate(str(root / "a"), s)
    loaders = real_train_loaders(root / "a", s)
    train = sim.train
    assert train["micro_batches_per_rank"] == [len(ld) for ld in loaders]
    epoch = max(train["micro_batches_per_rank"])
    order = global_order(loaders, epoch)
    # samples per shard in one epoch's micro-batches: exactly what the loaders delivered
    drawn = Counter(shard for _, shard in order)
    (source,) = train["sources"]
    assert {sh["shard"]: sh["drawn"] for sh in source["shards"]} == dict(drawn)
    # the shuffle figure over the same window
    shuffle = train["shuffle"]
    window = order[: shuffle["samples"]]
    same = sum(1 for a, b in zip(window, window[1:]) if a == b) / (len(window) - 1)
    assert shuffle["same_shard"] == pytest.approx(same)
    assert 0 < shuffle["same_shard_if_random"] < 1


@pytest.mark.parametrize(
    "data,world_size,num_workers,batch_size",
    [("a", 3, 1, 2), ("a", 3, 1, 13), ("small", 4, 3, 2)],  # small: 10 samples, 12 streams
)
def test_val_counts_per_rank_match_real_loaders(root, data, world_size, num_workers, batch_size):
    s = settings(world_size=world_size, num_workers=num_workers, batch_size=batch_size)
    sim = simulate(str(root / data), s)
    val = sim.val
    for rank in range(world_size):
        wc = WorkerConfig(rank=rank, world_size=world_size, num_workers=num_workers)
        ds = get_val_dataset(root / data, worker_config=wc, batch_size=batch_size)
        batches = list(get_loader(ds))
        real = [b for b in batches if not all(is_padding(b))]
        assert val["micro_batches_per_rank"][rank] == len(batches)
        assert val["real_per_rank"][rank] == len(real)
        assert val["fillers_per_rank"][rank] == len(batches) - len(real)
    uneven = len(set(val["real_per_rank"])) > 1
    assert uneven == any("uneven validation" in w for w in sim.warnings)
    assert uneven == (data == "small")  # two streams have no sample: fillers


@pytest.mark.parametrize("shuffle_buffer_size", [None, 20])
def test_blend_proportions_match_real_loaders(root, shuffle_buffer_size):
    s = settings(steps=30, window=60, shuffle_buffer_size=shuffle_buffer_size)
    sim = simulate(str(root / "blend.yaml"), s)
    names = [src["name"].split(" ")[0] for src in sim.blend.sources]
    delivered = sim.train["delivered"]
    loaders = real_train_loaders(root / "blend.yaml", s)
    order = global_order(loaders, s.steps)
    assert delivered["samples"] == len(order) == s.steps * R * B
    for window in delivered["windows"]:  # every window's shares, exactly
        part = order[window["start"] : window["start"] + delivered["window"]]
        real = Counter(path for path, _ in part)
        assert [real[name] for name in names] == window["counts"]
    if shuffle_buffer_size is None:  # without a buffer, delivered = picked by the schedule
        assert [src["consumed"] for src in sim.blend.sources] == delivered["totals"]


def test_warnings(tmp_path, root):
    make_text_dataset(tmp_path / "tiny", num_samples=45, num_shards=3)
    (tmp_path / "twice.yaml").write_text(
        f"""
__class__: MetadatasetV2
splits:
  train:
    blend:
      - weight: 1
        path: {root / "a"}
      - weight: 1
        path: {root / "a"}
      - weight: 0.0001
        path: {tmp_path / "tiny"}
"""
    )
    sim = simulate(
        str(tmp_path / "twice.yaml"), settings(world_size=8, num_workers=2, steps=2, max_length=20)
    )
    text = "\n".join(sim.warnings)
    assert "leaf listed twice" in text
    assert "weight rounds away" in text and "tiny" in text
    assert "fewer slices than readers" in text or "fewer samples than readers" in text
    assert "longer than the packing limit 20" in text
    # the leaf listed twice is checked (and reported) once
    too_long = [w for w in sim.warnings if "longer than the packing limit" in w]
    assert [w for w in too_long if f"in {root / 'a'} [train]" in w] == too_long[:1]
    assert len(too_long) == 2  # a, and tiny


def test_cli(root, tmp_path):
    out = tmp_path / "sim.json"
    result = CliRunner().invoke(
        main,
        [
            "simulate",
            str(root / "blend.yaml"),
            "--world-size",
            "2",
            "--num-workers",
            "2",
            "--batch-size",
            "4",
            "--steps",
            "10",
            "--json",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "micro-batches per rank per epoch" in result.output
    assert "blend (requested vs. drawn shares per window)" in result.output
    figures = json.loads(out.read_text())
    assert figures["train"]["num_streams"] == 4
