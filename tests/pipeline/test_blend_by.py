"""Blends weighted by tokens (``blend_by``) through real loaders over real shards: the token share of
every window, exact and elastic restore, weight schedules and online changes, the ledger, the blend
report and ``energon blend-plan``'s simulation, and the configuration errors."""

from __future__ import annotations

import json
import math

import pytest

from energon import (
    Blender,
    Ledger,
    WorkerConfig,
    get_savable_loader,
    get_train_dataset,
    redistribute_states,
)
from energon.demo import write_text_shards
from energon.errors import MetadatasetError
from energon.loader.blend_report import simulate_blend
from energon.preflight.simulate import SimulationSettings, simulate
from energon.prepare.dataset import prepare_dataset
from tests.helpers.datasets import TEXT_YAML

L = 4


def text_dataset(root, num_samples, num_shards, min_chars, max_chars, seed):
    write_text_shards(
        root,
        num_samples=num_samples,
        num_shards=num_shards,
        min_chars=min_chars,
        max_chars=max_chars,
        seed=seed,
    )
    prepare_dataset(root, split_parts_ratio=[("train", 1.0)], progress=False, num_workers=1)
    (root / ".nv-meta" / "dataset.yaml").write_text(TEXT_YAML)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("blendby")
    text_dataset(root / "short", 240, 4, 5, 60, seed=0)  # captions: 2-15 tokens
    text_dataset(root / "long", 120, 3, 200, 400, seed=1)  # documents: 50-100 tokens
    return root


def config(root, name, weight_short="1", weight_long="1", blend_by="tokens"):
    path = root / name
    path.write_text(
        f"""
__class__: MetadatasetV2
splits:
  train:
    blend_by: {blend_by}
    blend:
      - weight: {weight_short}
        path: ./short
        subflavors: {{src: short}}
      - weight: {weight_long}
        path: ./long
        subflavors: {{src: long}}
"""
    )
    return path


def loader(path, *, rank=0, world_size=1, num_workers=0, state=None, **kwargs):
    wc = WorkerConfig(rank=rank, world_size=world_size, num_workers=num_workers)
    options = dict(batch_size=2, shuffle_buffer_size=5, max_samples_per_sequence=10)
    options.update(kwargs)
    ld = get_savable_loader(get_train_dataset(path, worker_config=wc, num_streams=L, **options))
    ld.restore_state_rank(state)
    return ld


def tokens(text: str) -> int:
    """The built-in estimate, computed here from the decoded text (the index has its bytes)."""
    return max(1, math.ceil(len(text.encode()) / 4))


def samples(batch):
    return [(sf["src"], tokens(text)) for sf, text in zip(batch.__subflavors__, batch.text)]


def keys(batch):
    return tuple(batch.__key__)


def take(it, n, what=keys):
    return [what(next(it)) for _ in range(n)]


def global_order(path, steps, *, world_size=1, num_workers=0, what=keys, **kwargs):
    per_rank = [
        take(
            iter(loader(path, rank=r, world_size=world_size, num_workers=num_workers, **kwargs)),
            steps,
            what,
        )
        for r in range(world_size)
    ]
    return [per_rank[r][k] for k in range(steps) for r in range(world_size)]


@pytest.mark.parametrize("weights", [("1", "1"), ("1", "4")])
def test_every_window_holds_the_token_shares_within_one_percent(root, weights):
    """Windows of the delivered global sequence (shuffle buffers included) of at least 20,000
    tokens: each dataset's share of the tokens is within 1% of its weight; by samples the mix is
    far from it."""
    path = config(root, f"share_{'_'.join(weights)}.yaml", *weights)
    order = [s for batch in global_order(path, 2500, what=samples) for s in batch]
    share = float(weights[0]) / (float(weights[0]) + float(weights[1]))
    total = [0]
    short = [0]
    for src, n in order:
        total.append(total[-1] + n)
        short.append(short[-1] + (n if src == "short" else 0))
    windows = 0
    for a in range(0, len(order), 250):
        b = next((b for b in range(a, len(order) + 1) if total[b] - total[a] >= 20_000), None)
        if b is None:
            break
        windows += 1
        assert abs((short[b] - short[a]) / (total[b] - total[a]) - share) <= 0.01, (a, b)
    assert windows >= 5
    by_samples = sum(1 for src, _ in order if src == "short") / len(order)
    assert abs(by_samples - share) > 0.1


def test_the_order_depends_on_the_logical_streams_only(root):
    path = config(root, "layout.yaml", "2", "1")
    reference = global_order(path, 300)
    for world_size, num_workers in [(2, 1), (1, 2)]:
        got = global_order(path, 300 // world_size, world_size=world_size, num_workers=num_workers)
        assert got == reference, (world_size, num_workers)


@pytest.mark.parametrize("split", [1, 555])
def test_restore_anywhere_is_exact_and_elastic(root, split):
    path = config(root, "restore.yaml", "1", "2")
    reference = take(iter(loader(path)), 700)
    first = loader(path, num_workers=2)
    it = iter(first)
    assert take(it, split) == reference[:split]
    state = json.loads(json.dumps(first.save_state_rank()))
    assert take(iter(loader(path, state=state)), 700 - split) == reference[split:]
    # two ranks, resumed on three (the global order is that of one rank)
    ranks = [loader(path, rank=r, world_size=2) for r in range(2)]
    its = [iter(ld) for ld in ranks]
    before = [keys(next(its[r])) for _ in range(split // 2) for r in range(2)]
    assert before == reference[: len(before)]
    states = redistribute_states(json.loads(json.dumps([ld.save_state_rank() for ld in ranks])), 3)
    resumed = [iter(loader(path, rank=r, world_size=3, state=states[r])) for r in range(3)]
    after = [keys(next(resumed[r])) for _ in range(15) for r in range(3)]
    assert after == reference[len(before) : len(before) + 45]


def test_online_change_and_weight_schedule_follow_tokens_and_resume(root):
    path = config(root, "online.yaml", "{step: [[0, 1.0], [1600, 3.0]]}", "1")
    ld = loader(path, batch_size=2)
    it = iter(ld)
    first = [s for b in take(it, 1600, samples) for s in b]
    state = json.loads(json.dumps(ld.save_state_rank()))
    ld.set_blend_weights([1, 4])
    after = [s for b in take(it, 1000, samples) for s in b]

    def short_share(part):
        return sum(n for src, n in part if src == "short") / sum(n for _, n in part)

    assert abs(short_share(first[:1550]) - 0.5) < 0.02  # weight 1:1 until sample 1600
    assert abs(short_share(first[1700:]) - 0.75) < 0.02  # then 3:1
    assert abs(short_share(after[100:]) - 0.2) < 0.01  # the change: 1:4 by tokens
    # resuming before the change and repeating it gives the same samples
    resumed = loader(path, batch_size=2, state=state)
    rit = iter(resumed)
    resumed.set_blend_weights([1, 4])
    assert [s for b in take(rit, 1000, samples) for s in b] == after


def test_ledger_blend_plan_and_live_report_agree_with_the_loader(root):
    path = config(root, "ledger.yaml", "1", "3")
    ld = loader(path, batch_size=4, shuffle_buffer_size=None)
    ld.blend_window = 400
    it = iter(ld)
    got = take(it, 400)
    ledger = Ledger(ld.dataset)
    for step in (0, 57, 399):
        (record,) = ledger.describe_step(step)
        assert tuple(s.key for s in record.samples) == got[step]
    live = ld.blend_report()
    assert live.unit == "tokens" and live.windows
    planned = simulate_blend(ld.dataset.spec, 1600, 400)
    assert planned.unit == "tokens"
    assert [(w.start, w.picks, w.size) for w in planned.windows] == [
        (w.start, w.picks, w.size) for w in live.windows
    ]
    for p, w in zip(planned.windows, live.windows):
        assert p.observed == pytest.approx(w.observed) and p.requested == pytest.approx(w.requested)
        assert abs(w.observed[0] - 0.25) < 0.03
    assert "tokens picked" in planned.table()
    rows = list(live)
    assert rows[0]["size"] + rows[1]["size"] == pytest.approx(sum(w.size for w in planned.windows))
    # energon simulate: the blend and the delivered shares are of tokens too
    settings = SimulationSettings(world_size=1, num_workers=1, batch_size=4, steps=400)
    found = simulate(str(path), settings)
    assert found.blend.unit == "tokens"
    delivered = found.train["delivered"]
    assert delivered["unit"] == "tokens"
    for window in delivered["windows"][:-1]:
        assert abs(window["sizes"][0] / sum(window["sizes"]) - 0.25) < 0.03
    assert "tokens picked" in found.text()


def byte_size(meta):
    return meta.byte_size


def test_blend_by_functions_and_configuration_errors(root):
    blended = Blender([(root / "short", 1.0), (root / "long", 1.0)], blend_by=byte_size)
    ds = get_train_dataset(
        blended,
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0),
        batch_size=1,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
    )
    assert ds.spec.blend_by.function is byte_size
    assert ds.spec.fingerprint()["blend_by"].endswith("byte_size")
    plain = loader(config(root, "plain.yaml", blend_by="samples"))
    assert "blend_by" not in plain.dataset.spec.fingerprint()
    with pytest.raises(ValueError, match="set it in one place"):
        loader(config(root, "both.yaml"), blend_by="bytes")
    with pytest.raises(MetadatasetError, match="blend_by must be one of"):
        loader(config(root, "bad.yaml", blend_by="words"))
    nested = root / "nested.yaml"
    nested.write_text(
        """
__class__: MetadatasetV2
splits:
  train:
    blend:
      - path: ./short
      - blend_by: tokens
        blend: [{path: ./long}, {path: ./short}]
"""
    )
    with pytest.raises(MetadatasetError, match="nested inside another blend"):
        loader(nested)
    epochized = root / "epochized.yaml"
    epochized.write_text(
        """
__class__: MetadatasetV2
splits:
  train:
    blend_by: tokens
    blend_epochized: [{path: ./long}, {path: ./short}]
"""
    )
    with pytest.raises(MetadatasetError, match="unknown key"):
        loader(epochized)


def test_block_lookups_equal_the_size_of_each_sample(tmp_path):
    """The built-ins size whole blocks at once (one query); the answer is what the function says
    of each sample's metadata, over shards of image+text samples, inside a stream's range."""
    from energon.pipeline.blend_by import BLOCK, SampleSizes, estimated_tokens, sample_bytes
    from energon.source.kinds import open_leaf
    from energon.source.meta import SampleMeta, meta_reader
    from tests.helpers.datasets import make_captioning_dataset

    make_captioning_dataset(tmp_path / "cap", num_samples=60, num_shards=3)
    leaf = open_leaf(tmp_path / "cap", kind="webdataset", split_part="train", subflavors={})
    reader = meta_reader(leaf)
    for function in (estimated_tokens, sample_bytes, byte_size):
        each = [function(SampleMeta(reader, 0, i)) for i in range(len(leaf))]
        assert all(value > 0 for value in each)
        sizes = SampleSizes([leaf], function, ranges=[(7, 51)])
        assert [sizes.size(0, i) for i in range(7, 51)] == each[7:51]
        with pytest.raises(IndexError, match="outside this stream's range"):
            sizes.size(0, 3)
    assert BLOCK >= 64
    assert estimated_tokens(SampleMeta(reader, 0, 0)) == math.ceil(reader.part_sizes(0)["txt"] / 4)
