"""Weight schedules in metadataset YAML: the five forms, steps and the global batch size, nesting,
blend_epochized, fingerprints, and errors that name the file, the node and the key."""

from __future__ import annotations

import warnings

import pytest

from energon import Blender, WorkerConfig, get_train_dataset
from energon.metadataset.config import MetadatasetError
from energon.plan.schedules import Mixture, WeightSchedule
from tests.helpers.datasets import make_text_dataset


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("sched")
    make_text_dataset(root / "a", num_samples=40, num_shards=2)
    make_text_dataset(root / "b", num_samples=30, num_shards=2, seed=1)
    make_text_dataset(root / "c", num_samples=20, num_shards=1, seed=2)
    return root


def write(root, name, text):
    path = root / name
    path.write_text(text)
    return path


def blend(weight_a, weight_b="1", head=""):
    return f"""
__class__: MetadatasetV2
{head}
splits:
  train:
    blend:
      - weight: {weight_a}
        path: ./a
      - weight: {weight_b}
        path: ./b
"""


def dataset(path, **kwargs):
    wc = WorkerConfig(rank=0, world_size=1, num_workers=0)
    options = dict(batch_size=None, shuffle_buffer_size=None, max_samples_per_sequence=None)
    options.update(kwargs)
    return get_train_dataset(path, worker_config=wc, **options)


@pytest.mark.parametrize(
    "text,expected",
    [
        ("{constant: 2}", None),
        ("{step: [[0, 1.0], [500, 0.25]]}", WeightSchedule.step([(0, 1.0), (500, 0.25)])),
        (
            "{piecewise_linear: [[0, 0], [100, 2], [300, 1]]}",
            WeightSchedule.piecewise_linear([(0, 0.0), (100, 2.0), (300, 1.0)]),
        ),
        (
            "{linear: {start: 100, end: 900, from: 1, to: 0}}",
            WeightSchedule.linear(100, 900, 1.0, 0.0),
        ),
        (
            "{cosine: {start: 0, end: 1000, from: 3, to: 1}}",
            WeightSchedule.cosine(0, 1000, 3.0, 1.0),
        ),
    ],
)
def test_the_five_schedule_forms(root, text, expected):
    ds = dataset(write(root, "forms.yaml", blend(text)))
    if expected is None:  # a constant is a plain weight: nothing changes over time
        assert ds.spec.mixture is None
        assert [round(s.weight, 6) for s in ds.spec.sources] == [round(2 / 3, 6), round(1 / 3, 6)]
        return
    mixture = ds.spec.mixture
    assert mixture.levels == ((expected, WeightSchedule.constant(1.0)),)
    assert mixture.paths == (((0, 0),), ((0, 1),))
    start = expected.value_at(0)
    assert ds.spec.sources[0].weight == pytest.approx(start / (start + 1))
    assert "mixture" in ds.spec.fingerprint()


def test_steps_convert_with_the_yaml_or_the_api_global_batch_size(root):
    weight = "{linear: {start: 10, end: 20, from: 1, to: 0}, unit: steps}"
    path = write(root, "steps.yaml", blend(weight, head="global_batch_size: 64"))
    ds = dataset(path, global_batch_size=8)  # the file's own value wins for its schedules
    assert ds.spec.mixture.levels[0][0] == WeightSchedule.linear(640, 1280, 1.0, 0.0)
    assert ds.spec.global_batch_size == 8  # the API's value steps set_blend_weights(from_step)
    path = write(root, "steps_api.yaml", blend(weight))
    ds = dataset(path, global_batch_size=32)
    assert ds.spec.mixture.levels[0][0] == WeightSchedule.linear(320, 640, 1.0, 0.0)
    with pytest.raises(
        MetadatasetError, match=r"steps_api.yaml: splits.train.blend\[0\].*in steps"
    ):
        dataset(path)
    assert dataset(write(root, "gbs.yaml", blend("1", head="global_batch_size: 16")))
    assert (
        dataset(path, global_batch_size=32).spec.fingerprint()
        != dataset(path, global_batch_size=16).spec.fingerprint()
    ), "a schedule moved in samples is a different plan"


def test_nested_schedules_multiply_through_levels(root):
    write(
        root,
        "inner.yaml",
        """
__class__: MetadatasetV2
splits:
  train:
    blend:
      - {weight: {step: [[0, 1], [100, 3]]}, path: ./a}
      - {weight: 1, path: ./b}
""",
    )
    path = write(
        root,
        "outer.yaml",
        """
__class__: MetadatasetV2
splits:
  train:
    blend:
      - {weight: {linear: {start: 0, end: 1000, from: 1, to: 3}}, path: ./inner.yaml}
      - {weight: 1, path: ./c}
""",
    )
    spec = dataset(path).spec
    outer = (WeightSchedule.linear(0, 1000, 1.0, 3.0), WeightSchedule.constant(1.0))
    inner = (WeightSchedule.step([(0, 1.0), (100, 3.0)]), WeightSchedule.constant(1.0))
    assert spec.mixture == Mixture((outer, inner), (((0, 0), (1, 0)), ((0, 0), (1, 1)), ((0, 1),)))
    w = spec.mixture.weights_at(500)
    o = outer[0].value_at(500) / (outer[0].value_at(500) + 1)
    assert w == pytest.approx([o * 3 / 4, o * 1 / 4, 1 - o])


def test_python_blender_takes_schedule_objects(root):
    schedule = WeightSchedule.cosine(0, 10, 1.0, 0.0, unit="steps")
    ds = dataset(Blender([(root / "a", schedule), (root / "b", 1.0)], global_batch_size=100))
    assert ds.spec.mixture.levels[0][0] == WeightSchedule.cosine(0, 1000, 1.0, 0.0)
    assert ds.spec.global_batch_size == 100


def test_a_source_off_at_all_times_is_dropped_and_all_zero_times_are_errors(root):
    path = write(root, "off.yaml", blend("{step: [[0, 0], [100, 0]]}"))
    with pytest.warns(UserWarning, match="weight 0"):
        ds = dataset(path)
    assert len(ds.spec.sources) == 1 and ds.spec.mode == "none"
    path = write(
        root, "gap.yaml", blend("{step: [[0, 1], [100, 0]]}", "{step: [[0, 0], [200, 1]]}")
    )
    with pytest.raises(MetadatasetError, match="all 0 at global sample 100"):
        dataset(path)
    path = write(root, "tiny.yaml", blend("{step: [[0, 0.00001], [100, 0.0001]]}"))
    with pytest.warns(UserWarning, match="tiny blend weight"):
        dataset(path)


def test_fixed_weight_configs_keep_their_fingerprint_and_numbers(root):
    ds = dataset(write(root, "fixed.yaml", blend("3", "1")))
    assert ds.spec.mixture is None and "mixture" not in ds.spec.fingerprint()
    assert [s.weight for s in ds.spec.sources] == [0.75, 0.25]


@pytest.mark.parametrize(
    "weight,message",
    [
        ("{lineer: {start: 0, end: 1, from: 1, to: 0}}", r"weight: unknown key\(s\) \['lineer'\]"),
        ("{linear: {start: 0, end: 10, from: 1}}", r"weight.linear needs to"),
        ("{linear: {start: 10, end: 10, from: 1, to: 0}}", r"weight.linear: end must be after"),
        ("{linear: {start: -5, end: 10, from: 1, to: 0}}", r"weight.linear.start: times must"),
        ("{cosine: {start: 0, end: 10, from: 1, to: -1}}", r"weight.cosine.to: weights must"),
        ("{step: [[0, 1], [0, 2]]}", r"weight.step\[1\]: times must increase"),
        ("{step: [[0, 1, 2]]}", r"weight.step\[0\] must be a \[time, weight\] pair"),
        ("{step: []}", r"weight.step must be a non-empty list"),
        ("{piecewise_linear: [[0, 1]], unit: epochs}", r"weight.unit must be 'samples' or 'steps'"),
        ("{step: [[0, 1]], linear: {start: 0, end: 1, from: 0, to: 1}}", "exactly one schedule"),
        ("{step: [[0.5, 1]]}", r"weight.step\[0\]: times must be integers"),
        ("-1", "weight must be a number >= 0 or a schedule"),
    ],
)
def test_schedule_errors_name_file_node_and_key(root, weight, message):
    path = write(root, "bad.yaml", blend("1", weight))
    with pytest.raises(MetadatasetError, match=message) as info:
        dataset(path)
    assert r"bad.yaml: splits.train.blend[1]" in str(info.value)


def test_blend_epochized_has_no_schedules(root):
    path = write(
        root,
        "epo.yaml",
        """
__class__: MetadatasetV2
splits:
  train:
    blend_epochized:
      - {repetitions: {linear: {start: 0, end: 10, from: 1, to: 2}}, path: ./a}
      - {repetitions: 1, path: ./b}
""",
    )
    with pytest.raises(
        MetadatasetError, match=r"blend_epochized\[0\]: repetitions must be a number"
    ):
        dataset(path)
    path = write(
        root,
        "epo2.yaml",
        """
__class__: MetadatasetV2
splits:
  train:
    blend_epochized:
      - {weight: {step: [[0, 1]]}, path: ./a}
      - {repetitions: 1, path: ./b}
""",
    )
    with pytest.raises(MetadatasetError, match="weight schedules are only for 'blend'"):
        dataset(path)


def test_global_batch_size_is_checked(root):
    with pytest.raises(MetadatasetError, match="global_batch_size must be an integer >= 1"):
        dataset(write(root, "gbs_bad.yaml", blend("1", head="global_batch_size: 0")))
    # an argument's check names it first (issue 33): "global_batch_size: expected ..."
    with pytest.raises(ValueError, match="global_batch_size: expected an integer >= 1"):
        dataset(write(root, "gbs_ok.yaml", blend("1")), global_batch_size="64")


def test_a_source_missing_from_a_stream_cannot_carry_the_blend_alone(root):
    """c has 20 samples: with 32 logical streams, 12 streams hold none of them, so a schedule
    that gives only c weight would leave those streams nothing to read."""
    path = write(
        root,
        "alone.yaml",
        """
__class__: MetadatasetV2
splits:
  train:
    blend:
      - {weight: {step: [[0, 1], [100, 0]]}, path: ./a}
      - {weight: {step: [[0, 0], [100, 1]]}, path: ./c}
""",
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(MetadatasetError, match="logical stream .* of 32 has none"):
            dataset(path, num_streams=32)
        assert dataset(path, num_streams=8).spec.mixture is not None
