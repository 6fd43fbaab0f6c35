"""Metadatasets: YAML V1/V2, blends, epochized blends, subsets, subflavors, val concatenation,
save/restore in blends, the Blender API and clear errors."""

from __future__ import annotations

import warnings
from collections import Counter

import pytest

from energon import (
    Blender,
    WorkerConfig,
    get_savable_loader,
    get_train_dataset,
    get_val_dataset,
    redistribute_states,
)
from energon.metadataset.config import MetadatasetError
from tests.helpers.datasets import make_text_dataset


@pytest.fixture(scope="module")
def two_datasets(tmp_path_factory):
    root = tmp_path_factory.mktemp("mds")
    make_text_dataset(root / "a", num_samples=55, num_shards=5)
    make_text_dataset(root / "b", num_samples=30, num_shards=3, seed=1)
    return root


def write(root, name, text):
    path = root / name
    path.write_text(text)
    return path


def blend_yaml(wa=2, wb=8, kind="blend", key="weight"):
    return f"""
__module__: megatron.energon
__class__: MetadatasetV2
splits:
  train:
    {kind}:
      - {key}: {wa}
        path: ./a
        subflavors: {{src: a}}
      - {key}: {wb}
        path: ./b
        subflavors: {{src: b}}
  val:
    blend:
      - path: ./a
        split_part: train
        subflavors: {{src: a}}
      - path: ./b
        split_part: train
        subflavors: {{src: b}}
"""


def samples(path, n, *, rank=0, world_size=1, num_workers=0, **kwargs):
    wc = WorkerConfig(rank=rank, world_size=world_size, num_workers=num_workers)
    options = dict(batch_size=None, shuffle_buffer_size=None, max_samples_per_sequence=10)
    options.update(kwargs)
    it = iter(get_savable_loader(get_train_dataset(path, worker_config=wc, **options)))
    return [next(it) for _ in range(n)]


def test_blend_mix_is_exact_over_every_window(two_datasets):
    path = write(two_datasets, "blend.yaml", blend_yaml())
    got = samples(path, 5000, num_streams=4)
    sources = [s.__subflavors__["src"] for s in got]
    for start in range(0, 4001, 100):
        window = sources[start : start + 1000]
        assert abs(window.count("a") - 200) <= 20, start  # 2% of the window
    # every sample of each source is used, about equally often (streams hold 13 or 14 of them)
    a_keys = Counter(s.__key__ for s in got if s.__subflavors__["src"] == "a")
    mean = sum(a_keys.values()) / 55
    assert len(a_keys) == 55 and all(abs(c - mean) <= 0.15 * mean for c in a_keys.values())


def test_equal_weight_blend_global_steps_mix_sources(two_datasets):
    """Streams are not in lock-step: with micro-batch 1 on 4 ranks, a global step (one micro-batch
    per rank) holds both sources in most steps, and every rank still keeps the exact 50/50 mix
    over every window."""
    path = write(two_datasets, "blend_equal.yaml", blend_yaml(1, 1))
    per_rank = [
        [
            b.__subflavors__[0]["src"]
            for b in samples(path, 2000, rank=r, world_size=4, batch_size=1)
        ]
        for r in range(4)
    ]
    steps = list(zip(*per_rank))
    single_source = sum(1 for step in steps if len(set(step)) == 1)
    assert single_source < len(steps) / 2, f"{single_source} of {len(steps)} steps hold one source"
    for sources in per_rank:
        for start in range(0, 1001, 100):
            window = sources[start : start + 1000]
            assert abs(window.count("a") - 500) <= 20, start
    global_order = [src for step in steps for src in step]
    for start in range(0, 7001, 500):
        assert abs(global_order[start : start + 1000].count("a") - 500) <= 20, start


def test_blend_report_and_state_record_consumption(two_datasets):
    path = write(two_datasets, "blend2.yaml", blend_yaml())
    wc = WorkerConfig(rank=0, world_size=1, num_workers=0)
    loader = get_savable_loader(
        get_train_dataset(
            path,
            worker_config=wc,
            batch_size=10,
            shuffle_buffer_size=None,
            max_samples_per_sequence=10,
        )
    )
    it = iter(loader)
    for _ in range(100):
        next(it)
    report = loader.blend_report()
    assert [round(r["weight"], 3) for r in report] == [0.2, 0.8]
    assert sum(r["consumed"] for r in report) == 1000
    assert abs(report[0]["observed"] - 0.2) < 0.01


def test_nested_weights_multiply_and_duplicates_warn(two_datasets):
    write(two_datasets, "inner.yaml", blend_yaml(1, 1))
    path = write(
        two_datasets,
        "outer.yaml",
        """
__module__: megatron.energon
__class__: MetadatasetV2
splits:
  train:
    blend:
      - weight: 4
        path: ./inner.yaml
      - weight: 1
        path: ./inner.yaml
""",
    )
    wc = WorkerConfig(rank=0, world_size=1, num_workers=0)
    with pytest.warns(UserWarning, match="reached 2 times"):
        ds = get_train_dataset(
            path,
            worker_config=wc,
            batch_size=2,
            shuffle_buffer_size=None,
            max_samples_per_sequence=None,
        )
    assert [round(s.weight, 6) for s in ds.spec.sources] == [0.4, 0.4, 0.1, 0.1]


def test_tiny_and_zero_weights_warn(two_datasets):
    path = write(two_datasets, "tiny.yaml", blend_yaml(0.0001, 1))
    wc = WorkerConfig(rank=0, world_size=1, num_workers=0)
    with pytest.warns(UserWarning, match="tiny blend weight"):
        get_train_dataset(
            path,
            worker_config=wc,
            batch_size=2,
            shuffle_buffer_size=None,
            max_samples_per_sequence=None,
        )
    path = write(two_datasets, "zero.yaml", blend_yaml(0, 1))
    with pytest.warns(UserWarning, match="weight 0"):
        ds = get_train_dataset(
            path,
            worker_config=wc,
            batch_size=2,
            shuffle_buffer_size=None,
            max_samples_per_sequence=None,
        )
    assert len(ds.spec.sources) == 1


@pytest.mark.parametrize("reps,expected_a,expected_b", [((2, 3), 110, 90), ((0.7, 1.5), 38, 45)])
def test_epochized_blend_counts_are_global(two_datasets, reps, expected_a, expected_b):
    path = write(
        two_datasets,
        f"epo{reps[0]}.yaml",
        blend_yaml(*reps, kind="blend_epochized", key="repetitions"),
    )
    counts = {"a": Counter(), "b": Counter()}
    for rank in range(2):
        wc = WorkerConfig(rank=rank, world_size=2, num_workers=2)
        loader = get_savable_loader(
            get_train_dataset(
                path,
                worker_config=wc,
                batch_size=None,
                shuffle_buffer_size=None,
                max_samples_per_sequence=5,
                repeat=False,
            )
        )
        for s in loader:
            counts[s.__subflavors__["src"]][s.__key__] += 1
    assert sum(counts["a"].values()) == expected_a
    assert sum(counts["b"].values()) == expected_b
    if reps == (2, 3):
        assert set(counts["a"].values()) == {2} and len(counts["a"]) == 55
        assert set(counts["b"].values()) == {3} and len(counts["b"]) == 30
    else:
        assert max(counts["a"].values()) == 1 and set(counts["b"].values()) <= {1, 2}


def test_save_restore_mid_blend_is_exact_and_elastic(two_datasets):
    path = write(two_datasets, "blend3.yaml", blend_yaml(3, 7))

    def run(world_size, steps, states=None):
        per_rank, out_states = [], []
        for rank in range(world_size):
            wc = WorkerConfig(rank=rank, world_size=world_size, num_workers=0)
            loader = get_savable_loader(
                get_train_dataset(
                    path,
                    worker_config=wc,
                    batch_size=3,
                    shuffle_buffer_size=6,
                    max_samples_per_sequence=4,
                    num_streams=4,
                )
            )
            loader.restore_state_rank(states[rank] if states else None)
            it = iter(loader)
            per_rank.append([tuple(next(it).__key__) for _ in range(steps)])
            out_states.append(loader.save_state_rank())
        return [per_rank[r][k] for k in range(steps) for r in range(world_size)], out_states

    reference, _ = run(1, 40)
    first, states = run(2, 6)
    assert first == reference[:12]
    after, _ = run(3, 8, redistribute_states(states, 3))
    assert after == reference[12:36]


def test_val_concatenates_once_with_even_ranks(two_datasets):
    path = write(two_datasets, "blend4.yaml", blend_yaml())
    seen = Counter()
    lengths = []
    for rank in range(3):
        wc = WorkerConfig(rank=rank, world_size=3, num_workers=1)
        loader = get_savable_loader(get_val_dataset(path, worker_config=wc, batch_size=4))
        batches = list(loader)
        lengths.append(len(batches))
        for b in batches:
            for key, flavors in zip(b.__key__, b.__subflavors__):
                seen[(flavors["src"], key)] += 1
    assert len(set(lengths)) == 1
    assert len(seen) == 85 and set(seen.values()) == {1}


def test_subsets_and_subflavor_inheritance(two_datasets):
    write(
        two_datasets,
        "sub_inner.yaml",
        """
__module__: megatron.energon
__class__: MetadatasetV2
splits:
  train:
    blend:
      - path: ./a
        subset: {range: [10, 30]}
        subflavors: {level: inner, inner_only: 1}
""",
    )
    path = write(
        two_datasets,
        "sub_outer.yaml",
        """
__module__: megatron.energon
__class__: MetadatasetV2
splits:
  train:
    blend:
      - path: ./sub_inner.yaml
        subset: {range: [20%, 80%]}
        subflavors: {level: outer}
  val:
    path: ./a
    split_part: train
    subset: {range: [50, end]}
""",
    )
    wc = WorkerConfig(rank=0, world_size=1, num_workers=0)
    val = list(get_savable_loader(get_val_dataset(path, worker_config=wc, batch_size=None)))
    all_keys = [
        s.__key__
        for s in get_savable_loader(
            get_val_dataset(
                two_datasets / "a", split_part="train", worker_config=wc, batch_size=None
            )
        )
    ]
    assert [s.__key__ for s in val] == all_keys[50:55]
    train = samples(path, 12)
    assert {s.__key__ for s in train} == set(all_keys[14:26])
    assert train[0].__subflavors__ == {"level": "outer", "inner_only": 1}


def test_v1_metadataset(two_datasets):
    path = write(
        two_datasets,
        "v1.yaml",
        """
__module__: megatron.energon
__class__: Metadataset
splits:
  train:
    datasets:
      - weight: 1
        path: ./a
        subflavors: {src: a}
      - weight: 3
        path: ./b
        subflavor: legacy
        subflavors: {src: b}
""",
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        got = samples(path, 400)
    assert abs(sum(s.__subflavors__["src"] == "a" for s in got) - 100) <= 2
    assert (
        next(s for s in got if s.__subflavors__["src"] == "b").__subflavors__["__subflavor__"]
        == "legacy"
    )


def test_blender_api_matches_yaml(two_datasets):
    path = write(two_datasets, "blend5.yaml", blend_yaml(1, 3))
    blender = Blender(
        [
            {"path": str(two_datasets / "a"), "weight": 1, "subflavors": {"src": "a"}},
            {"path": str(two_datasets / "b"), "weight": 3, "subflavors": {"src": "b"}},
        ]
    )
    a = [(s.__key__, s.__subflavors__["src"]) for s in samples(path, 50)]
    b = [(s.__key__, s.__subflavors__["src"]) for s in samples(blender, 50)]
    assert a == b
    simple = samples(Blender([(two_datasets / "a", 0.5), (two_datasets / "b", 0.5)]), 10)
    assert len(simple) == 10


@pytest.mark.parametrize(
    "body,message",
    [
        ("splits:\n  train:\n    blend:\n      - path: ./a\n        colour: red\n", "unknown key"),
        ("splits:\n  train:\n    blend:\n      - path: ./missing\n", "does not exist"),
        (
            "splits:\n  train:\n    blend:\n      - path: ./a\n        weight: -1\n",
            "weight must be",
        ),
        (
            "splits:\n  train:\n    blend:\n      - path: ./epo.yaml\n      - path: ./a\n",
            "same blend mode",
        ),
        (
            "splits:\n  train:\n    blend:\n      - path: ./a\n        subset: {range: [0, 50%]}\n",
            "two percentages or two indices",
        ),
        ("splits:\n  val:\n    path: ./a\n", "no split 'train'"),
    ],
)
def test_bad_metadatasets_fail_clearly(two_datasets, body, message):
    write(two_datasets, "epo.yaml", blend_yaml(1, 2, kind="blend_epochized", key="repetitions"))
    path = write(
        two_datasets, "bad.yaml", "__module__: megatron.energon\n__class__: MetadatasetV2\n" + body
    )
    wc = WorkerConfig(rank=0, world_size=1, num_workers=0)
    with pytest.raises((MetadatasetError, FileNotFoundError), match=message):
        get_train_dataset(
            path,
            worker_config=wc,
            batch_size=2,
            shuffle_buffer_size=None,
            max_samples_per_sequence=None,
        )


def test_shuffle_over_epochs_multipliers_combine(two_datasets):
    write(
        two_datasets,
        "mult_inner.yaml",
        """
__class__: MetadatasetV2
splits:
  train:
    blend:
      - {path: ./a, shuffle_over_epochs_multiplier: 3}
      - {path: ./b, shuffle_over_epochs_multiplier: null}
""",
    )
    path = write(
        two_datasets,
        "mult_outer.yaml",
        """
__class__: MetadatasetV2
splits:
  train:
    blend:
      - {path: ./mult_inner.yaml}
      - {path: ./a, shuffle_over_epochs_multiplier: -1}
""",
    )
    wc = WorkerConfig(rank=0, world_size=1, num_workers=0)
    with pytest.warns(UserWarning, match="reached 2 times"):
        ds = get_train_dataset(
            path,
            worker_config=wc,
            batch_size=2,
            shuffle_buffer_size=None,
            max_samples_per_sequence=None,
            parallel_shard_iters=1,
            shuffle_over_epochs_multiplier=2,
        )
    assert [s.shuffle_over_epochs for s in ds.spec.sources] == [6, None, -1]
