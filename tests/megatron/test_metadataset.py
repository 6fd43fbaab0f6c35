"""Megatron token prefixes inside metadataset YAML, blended with a webdataset through a task encoder."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from energon import (
    WorkerConfig,
    get_savable_loader,
    get_train_dataset,
    get_val_dataset,
    redistribute_states,
    stateless,
)
from energon.megatron.gpt_dataset import GPTConfig
from energon.megatron.token_sample import is_token_sample, token_sample
from energon.metadataset.config import TOKEN_CONFIG_FIELDS, MetadatasetError
from energon.source.tokens import TokenLeaf
from energon.task_encoder import DefaultTaskEncoder
from tests.helpers.datasets import write_prefix
from tests.helpers.paths import DATASET_CONFIGS

CONFIGS = DATASET_CONFIGS
SEQ = 16
EOD = 0

YAML = """\
__module__: megatron.energon
__class__: MetadatasetV2
token_config:            # default for every token prefix below
  sequence_length: {seq}
  split: "90, 10, 0"
  tokenizer: {{class: Byte}}
  eod_token: 0
  path_to_cache: ./cache
splits:
  train:
    blend:
      - weight: 2
        path: ./tokens_a
        subflavors: {{source: a}}
      - weight: 1
        path: ./tokens_b
        token_config: {{random_seed: 7}}   # field-wise override of the default
        subflavors: {{source: b}}
      - weight: 1
        path: {text}
        subflavors: {{source: text}}
  val:
    blend:
      - path: ./tokens_a
      - path: {text_val}
"""


class ByteTokens(DefaultTaskEncoder):
    """Text samples become byte-token windows shaped like the token samples; those pass unchanged."""

    def __init__(self, sequence_length: int = SEQ) -> None:
        super().__init__()
        self.config = GPTConfig(sequence_length=sequence_length, eod_token=EOD)

    @stateless
    def encode_sample(self, sample):
        if is_token_sample(sample):
            return sample
        ids = [b + 1 for b in sample.text.encode("utf-8")] + [EOD]  # 0 stays the EOD id
        return token_sample(ids, self.config, like=sample)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, text_ds, text_val_ds):
    root = tmp_path_factory.mktemp("tokmds")
    write_prefix(str(root / "tokens_a"), 80, seed=1)
    write_prefix(str(root / "tokens_b"), 60, seed=2)
    (root / "mds.yaml").write_text(YAML.format(seq=SEQ, text=text_ds, text_val=text_val_ds))
    return root


def loader(path, *, rank=0, world_size=1, num_workers=0, num_streams=None, **kw):
    wc = WorkerConfig(rank=rank, world_size=world_size, num_workers=num_workers)
    options = dict(
        batch_size=4,
        shuffle_buffer_size=6,
        max_samples_per_sequence=5,
        task_encoder=ByteTokens(),
    )
    if num_streams is not None:
        options["num_streams"] = num_streams
    options.update(kw)
    return get_savable_loader(get_train_dataset(path, worker_config=wc, **options))


def take(it, n):
    return [next(it) for _ in range(n)]


def keys(batches):
    return [tuple(b["__key__"]) for b in batches]


def same_batches(xs, ys):
    assert keys(xs) == keys(ys)
    for x, y in zip(xs, ys):
        assert set(x) == set(y)
        for name in ("tokens", "labels", "loss_mask", "position_ids", "attention_mask"):
            assert torch.equal(x[name], y[name]), name


def test_yaml_blend_of_token_prefixes_and_text(workspace, text_ds):
    ld = loader(workspace / "mds.yaml")
    batches = take(iter(ld), 100)
    b = batches[0]
    assert b["tokens"].shape == (4, SEQ) and b["labels"].shape == (4, SEQ)
    assert b["loss_mask"].shape == (4, SEQ) and b["position_ids"].shape == (4, SEQ)
    assert b["attention_mask"].shape == (4, 1, SEQ, SEQ)
    assert b["tokens"].dtype == torch.int64 and b["loss_mask"].dtype == torch.float32

    # weights 2:1:1 are kept (deterministic largest-deficit interleaving)
    report = ld.blend_report()
    assert [round(r["weight"], 3) for r in report] == [0.5, 0.25, 0.25]
    assert sum(r["consumed"] for r in report) >= 400
    for r in report:
        assert abs(r["observed"] - r["weight"]) < 0.02, report
    # dict samples batch field by field: __subflavors__ becomes {"source": [...]}
    sources = [s for batch in batches for s in batch["__subflavors__"]["source"]]
    counts = {name: sources.count(name) for name in ("a", "b", "text")}
    assert abs(counts["a"] - 200) <= 8 and abs(counts["b"] - 100) <= 8, counts

    # token samples are megatron's windows with the YAML's settings (b with its own seed)
    spec = ld.dataset.spec
    leaves = {s.leaf.name: s.leaf for s in spec.sources if isinstance(s.leaf, TokenLeaf)}
    assert len(leaves) == 2
    configs = {Path(name).name: leaf.dataset.config for name, leaf in leaves.items()}
    assert configs["tokens_a-train"].random_seed == 1234
    assert configs["tokens_b-train"].random_seed == 7
    assert configs["tokens_b-train"].path_to_cache == str(workspace / "cache")
    assert all(c.sequence_length == SEQ and c.split == "90, 10, 0" for c in configs.values())
    checked = 0
    for batch in batches[:20]:
        for i, key in enumerate(batch["__key__"]):
            name, _, index = key.rpartition("/")
            if name in leaves:
                window = leaves[name].dataset.window(int(index))
                assert batch["tokens"][i].tolist() == window[:-1].tolist()
                assert batch["labels"][i].tolist() == window[1:].tolist()
                checked += 1
            else:  # a text sample: its bytes, shifted labels, padding loss-masked
                assert batch["__subflavors__"]["source"][i] == "text"
                assert batch["labels"][i][:-1].tolist() == batch["tokens"][i][1:].tolist()
    assert checked > 20


def test_text_encoding_pads_and_masks():
    cfg = GPTConfig(sequence_length=8, eod_token=EOD)
    s = token_sample([5, 6, 7, EOD], cfg, like={"__key__": "k", "__restore_key__": ("x",)})
    assert s["tokens"].tolist() == [5, 6, 7, 0, 0, 0, 0, 0]
    assert s["labels"].tolist() == [6, 7, 0, 0, 0, 0, 0, 0]
    assert s["loss_mask"].tolist() == [1, 1, 1, 0, 0, 0, 0, 0]  # the pad (-1) labels are masked
    assert s["__key__"] == "k" and s["__subflavors__"] == {}
    long = token_sample(list(range(1, 40)), cfg)
    assert long["tokens"].tolist() == list(range(1, 9)) and long["labels"][-1] == 9
    assert is_token_sample(s) and not is_token_sample({"text": "x"})


@pytest.mark.parametrize("num_workers", [0, 2])
def test_save_restore_exact_mid_run(workspace, num_workers):
    first = loader(workspace / "mds.yaml", num_workers=num_workers)
    it = iter(first)
    take(it, 7)
    state = json.loads(json.dumps(first.save_state_rank()))
    expected = take(it, 10)
    restored = loader(workspace / "mds.yaml", num_workers=num_workers)
    restored.restore_state_rank(state)
    same_batches(take(iter(restored), 10), expected)


def run_ranks(path, world_size, num_workers, steps, states=None):
    loaders, per_rank = [], []
    for rank in range(world_size):
        ld = loader(path, rank=rank, world_size=world_size, num_workers=num_workers, num_streams=4)
        if states is not None:
            ld.restore_state_rank(states[rank])
        per_rank.append(take(iter(ld), steps))
        loaders.append(ld)
    order = [per_rank[r][k] for k in range(steps) for r in range(world_size)]
    return order, [ld.save_state_rank() for ld in loaders]


def test_elastic_restore_from_two_ranks_to_one(workspace):
    path = workspace / "mds.yaml"
    reference, _ = run_ranks(path, 1, 0, 20)
    before, states = run_ranks(path, 2, 1, 4)
    same_batches(before, reference[:8])
    merged = redistribute_states(json.loads(json.dumps(states)), 1)
    after, _ = run_ranks(path, 1, 0, 12, states=merged)
    assert len(before) == 8 and len(after) == 12
    same_batches(after, reference[8:20])  # asserts batch by batch


def test_kwarg_is_the_default_and_yaml_overrides_it(workspace, tmp_path, text_ds):
    (tmp_path / "m.yaml").write_text(
        f"""
__class__: MetadatasetV2
splits:
  train:
    blend:
      - path: {workspace / "tokens_a"}
      - path: {workspace / "tokens_b"}
        token_config: {{random_seed: 9}}
      - path: {text_ds}
"""
    )
    base = GPTConfig(
        sequence_length=SEQ, split="90,10,0", eod_token=0, path_to_cache=str(tmp_path / "c")
    )
    wc = WorkerConfig(rank=0, world_size=1, num_workers=0)
    ds = get_train_dataset(
        tmp_path / "m.yaml",
        worker_config=wc,
        batch_size=2,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
        task_encoder=ByteTokens(),
        token_config=base,
    )
    configs = [s.leaf.dataset.config for s in ds.spec.sources if isinstance(s.leaf, TokenLeaf)]
    assert configs == [base, dataclasses.replace(base, random_seed=9)]
    assert next(iter(get_savable_loader(ds)))["tokens"].shape == (2, SEQ)
    # a mapping works as the argument too
    ds2 = get_train_dataset(
        tmp_path / "m.yaml",
        worker_config=wc,
        batch_size=2,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
        task_encoder=ByteTokens(),
        token_config={
            "sequence_length": SEQ,
            "split": "90,10,0",
            "path_to_cache": str(tmp_path / "c"),
        },
    )
    assert ds2.spec.sources[1].leaf.dataset.config.random_seed == 9


def test_validation_reads_token_and_text_once(workspace, text_val_ds):
    wc = WorkerConfig(rank=0, world_size=1, num_workers=0)
    ds = get_val_dataset(
        workspace / "mds.yaml", worker_config=wc, batch_size=5, task_encoder=ByteTokens()
    )
    got = [k for batch in get_savable_loader(ds) for k in batch["__key__"]]
    tokens_val = TokenLeaf.from_blend(
        [str(workspace / "tokens_a")],
        config=GPTConfig(sequence_length=SEQ, split="90, 10, 0", tokenizer={"class": "Byte"}),
        split="valid",
    )
    assert len(got) == len(set(got)) == len(tokens_val) + 40


def test_example_config_in_dataset_configs(tmp_path, text_ds):
    shutil.copy(CONFIGS / "megatron_tokens.yaml", tmp_path / "megatron_tokens.yaml")
    write_prefix(str(tmp_path / "tokens_a"), 50, seed=3)
    write_prefix(str(tmp_path / "tokens_b"), 50, seed=4)
    shutil.copytree(text_ds, tmp_path / "texts")
    ld = loader(tmp_path / "megatron_tokens.yaml", task_encoder=ByteTokens(sequence_length=32))
    batch = next(iter(ld))
    assert batch["tokens"].shape == (4, 32)


# -- errors ------------------------------------------------------------------------------------------


def bad(tmp_path, body):
    path = tmp_path / "bad.yaml"
    path.write_text("__class__: MetadatasetV2\n" + body)
    wc = WorkerConfig(rank=0, world_size=1, num_workers=0)
    return lambda **kw: get_train_dataset(
        path,
        worker_config=wc,
        batch_size=2,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
        **kw,
    )


@pytest.mark.parametrize(
    "body,message",
    [
        (
            "splits:\n  train:\n    path: {a}\n    token_config: {{sequence_length: 8, seqlen: 3}}\n",
            r"bad\.yaml: splits\.train: token_config: unknown key\(s\) \['seqlen'\]",
        ),
        (
            "token_config: {{sequence_lenght: 8}}\nsplits:\n  train:\n    path: {a}\n",
            r"bad\.yaml: token_config: unknown key\(s\) \['sequence_lenght'\]",
        ),
        (
            "splits:\n  train:\n    blend:\n      - path: {a}\n        token_config: {{random_seed: 3}}\n",
            r"bad\.yaml: splits\.train\.blend\[0\] \(.*tokens_a\) is a Megatron token dataset, but no "
            r"token_config sets sequence_length",
        ),
        (
            "splits:\n  train:\n    path: {a}\n    token_config: {{sequence_length: '8'}}\n",
            r"bad\.yaml: splits\.train: token_config\.sequence_length must be an integer >= 1, got '8'",
        ),
        (
            "splits:\n  train:\n    path: {a}\n    token_config: {{sequence_length: 0}}\n",
            r"token_config\.sequence_length must be an integer >= 1",
        ),
        (
            "splits:\n  train:\n    path: {a}\n    token_config: {{sequence_length: 8, split: abc}}\n",
            r"token_config\.split must be null or a split string",
        ),
        (
            "splits:\n  train:\n    path: {a}\n    token_config: [8]\n",
            r"bad\.yaml: splits\.train: 'token_config' must be a mapping",
        ),
        (
            "splits:\n  train:\n    path: {t}\n    token_config: {{sequence_length: 8}}\n",
            r"bad\.yaml: splits\.train: token_config is only for Megatron token prefixes",
        ),
        (
            "splits:\n  train:\n    path: {a}\n",
            r"bad\.yaml.* no token_config sets sequence_length",
        ),
    ],
)
def test_bad_yaml_errors_name_the_file_and_key(workspace, tmp_path, text_ds, body, message):
    build = bad(tmp_path, body.format(a=workspace / "tokens_a", t=text_ds))
    with pytest.raises(MetadatasetError, match=message):
        build()


def test_token_config_fields_are_gpt_config_fields():
    fields = {f.name for f in dataclasses.fields(GPTConfig)}
    assert set(TOKEN_CONFIG_FIELDS) == fields - {"mock", "mock_vocab_size"}


def test_all_token_samples_keep_int_ids(workspace):
    batch = next(iter(loader(workspace / "mds.yaml")))
    assert np.all(batch["tokens"].numpy() >= 0)


SCHEDULED_YAML = """\
__class__: MetadatasetV2
global_batch_size: 8
token_config: {{sequence_length: {seq}, split: "90, 10, 0", tokenizer: {{class: Byte}}, eod_token: 0,
               path_to_cache: ./cache}}
splits:
  train:
    blend:
      - weight: {{step: [[0, 3], [40, 1]], unit: steps}}   # anneal away from tokens_a at step 40
        path: ./tokens_a
        subflavors: {{source: a}}
      - weight: {{linear: {{start: 0, end: 40, from: 1, to: 3}}, unit: steps}}
        path: ./tokens_b
        subflavors: {{source: b}}
"""


@pytest.mark.parametrize("num_workers", [0, 2])
def test_weight_schedules_apply_to_token_prefixes(workspace, num_workers):
    """Megatron token prefixes in a metadataset blend follow weight schedules (in steps of a
    global batch of 8), and restore exactly in the middle of one."""
    path = workspace / "scheduled.yaml"
    path.write_text(SCHEDULED_YAML.format(seq=SEQ))
    ld = loader(path, num_workers=num_workers, num_streams=2, shuffle_buffer_size=None)
    mixture = ld.dataset.spec.mixture
    assert mixture.levels[0][0].points == ((0, 3.0), (320, 1.0))  # steps x 8 samples
    it = iter(ld)
    batches = take(it, 150)  # 600 samples: steps 0..74 of 8 samples
    sources = [s for b in batches for s in b["__subflavors__"]["source"]]
    assert abs(sources[:80].count("a") - 80 * 0.73) <= 4  # about 3 : 1.1 at the start
    assert abs(sources[400:].count("a") - 200 * 0.25) <= 4  # 1 : 3 after step 40
    state = json.loads(json.dumps(ld.save_state_rank()))
    expected = take(it, 10)
    restored = loader(path, num_workers=0, num_streams=2, shuffle_buffer_size=None)
    restored.restore_state_rank(state)
    same_batches(take(iter(restored), 10), expected)
