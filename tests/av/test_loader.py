"""Audio/video datasets through the loader: decode modes, sample types, corrupt media."""

from __future__ import annotations

import io
import json
import textwrap

import pytest
import torch
from PIL import Image

av = pytest.importorskip("av")

from energon import (  # noqa: E402
    DefaultTaskEncoder,
    WorkerConfig,
    get_loader,
    get_val_dataset,
    reraise_exception,
)
from energon.av import AVData, AVDecoder, get_single_frames_uniform  # noqa: E402
from energon.decode import SampleDecoder  # noqa: E402
from energon.demo.av import encode_audio, encode_video, frame_number, write_tar_shards  # noqa: E402
from energon.prepare.dataset import prepare_dataset  # noqa: E402
from energon.samples import (  # noqa: E402
    InterleavedSample,
    SimilarityInterleavedSample,
    VidQASample,
)

VIDQA_YAML = """sample_type:
  __module__: megatron.energon
  __class__: VidQASample
field_map:
  video: mp4
  context: txt
  answers: json[answers]
"""

CRUDE_YAML = """__module__: megatron.energon
__class__: CrudeWebdataset
"""

SAMPLE_LOADER_YAML = """sample_type:
  __module__: megatron.energon
  __class__: {cls}
sample_loader: sample_loader.py:sample_loader
part_filter: sample_loader.py:part_filter
"""

INTERLEAVED_LOADER = textwrap.dedent(
    """
    def sample_loader(raw):
        order = raw["json"]["order"]
        return {"sequence": [raw[part] for part in order]}

    def part_filter(part):
        return part in ("json", "txt", "0.png", "1.png", "2.txt")
    """
)

SIMILARITY_LOADER = textwrap.dedent(
    """
    def sample_loader(raw):
        return {
            "images": [raw["png"]],
            "texts": [raw["txt"]],
            "audio": [raw["a.wav"], raw["b.flac"]],
            "video": [raw["mkv"]],
        }

    def part_filter(part):
        return part in ("png", "txt", "a.wav", "b.flac", "mkv")
    """
)


def png(color: tuple[int, int, int]) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (8, 6), color).save(buf, "PNG")
    return buf.getvalue()


def make_dataset(root, samples, yaml_text, num_shards=2, loader_script=None):
    write_tar_shards(root, samples, num_shards)
    prepare_dataset(root, split_parts_ratio=[("train", 1.0)], progress=False, num_workers=1)
    (root / ".nv-meta" / "dataset.yaml").write_text(yaml_text)
    if loader_script is not None:
        (root / ".nv-meta" / "sample_loader.py").write_text(loader_script)
    return root


def load(root, *, num_workers=0, batch_size=None, task_encoder=None, **config):
    wc = WorkerConfig(rank=0, world_size=1, num_workers=num_workers, **config)
    dataset = get_val_dataset(
        root, split_part="train", worker_config=wc, batch_size=batch_size, task_encoder=task_encoder
    )
    return list(get_loader(dataset))


@pytest.fixture(scope="module")
def clip() -> bytes:
    return encode_video(seconds=1, audio_codec="aac", gop=10)


@pytest.fixture(scope="module")
def vidqa_ds(tmp_path_factory, clip):
    samples = [
        (
            f"v{i:03d}",
            {
                "mp4": clip,
                "txt": f"what happens in clip {i}?".encode(),
                "json": json.dumps({"answers": [f"answer {i}"]}).encode(),
            },
        )
        for i in range(4)
    ]
    return make_dataset(tmp_path_factory.mktemp("vidqa"), samples, VIDQA_YAML)


class FramesEncoder(DefaultTaskEncoder):
    """Turns the lazy video into 4 uniformly spaced, resized frames (what a VLM would use)."""

    def encode_sample(self, sample: VidQASample) -> VidQASample:
        frames = get_single_frames_uniform(sample.video, 4, video_out_frame_size=(32, 24))
        return VidQASample.derive_from(sample, video=frames, context=sample.context)


def test_vidqa_video_is_a_lazy_decoder_by_default(vidqa_ds):
    samples = load(vidqa_ds)
    assert [s.__key__ for s in samples] == ["v000", "v001", "v002", "v003"]
    video = samples[0].video
    # named "<key>.<part>" when the reader passes the key to decode_part, else by the part
    assert isinstance(video, AVDecoder) and video.name in ("v000.mp4", "mp4")
    assert samples[2].context == "what happens in clip 2?" and samples[2].answers == ["answer 2"]
    assert video.get_video_duration(get_frame_count=True) == (1.0, 30)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_vidqa_frames_in_batches(vidqa_ds, num_workers):
    batches = load(vidqa_ds, num_workers=num_workers, batch_size=2, task_encoder=FramesEncoder())
    assert sum(len(b.__key__) for b in batches) == 4
    video = batches[0].video
    assert isinstance(video, torch.Tensor) and video.shape == (2, 4, 3, 24, 32)


def test_torch_mode_decodes_everything(vidqa_ds):
    encoder = DefaultTaskEncoder()
    encoder.decoder = SampleDecoder(av_decode="torch", video_decode_audio=True)
    sample = load(vidqa_ds, task_encoder=encoder)[0]
    assert isinstance(sample.video, AVData)
    assert sample.video.video_clips[0].shape == (30, 3, 48, 64)
    assert [frame_number(f.numpy()) for f in sample.video.video_clips[0][:3]] == [0, 1, 2]
    assert sample.video.audio_clips[0].shape[0] == 2


def test_pyav_mode_gives_an_open_container(vidqa_ds):
    encoder = DefaultTaskEncoder()
    encoder.decoder = SampleDecoder(av_decode="pyav")
    container = load(vidqa_ds, task_encoder=encoder)[0].video
    try:
        assert len(container.streams.video) == 1
    finally:
        container.close()


def test_crude_samples_with_audio_parts(tmp_path):
    samples = [
        (f"a{i}", {"wav": encode_audio(rate=8000, seconds=0.5), "txt": b"hello"}) for i in range(3)
    ]
    make_dataset(tmp_path, samples, CRUDE_YAML, num_shards=1)
    loaded = load(tmp_path)
    assert len(loaded) == 3
    audio = loaded[0]["wav"]
    assert isinstance(audio, AVDecoder)
    clips, _ = audio.get_audio_clips([(0.0, 0.25)])
    assert clips[0].shape == (1, 2000) and loaded[0]["txt"] == "hello"


def test_interleaved_sample_mixes_text_and_images(tmp_path):
    order = ["txt", "0.png", "2.txt", "1.png"]
    samples = [
        (
            f"d{i}",
            {
                "txt": b"first",
                "0.png": png((255, 0, 0)),
                "2.txt": b"between",
                "1.png": png((0, 0, 255)),
                "json": json.dumps({"order": order}).encode(),
            },
        )
        for i in range(2)
    ]
    yaml_text = SAMPLE_LOADER_YAML.format(cls="InterleavedSample")
    make_dataset(tmp_path, samples, yaml_text, num_shards=1, loader_script=INTERLEAVED_LOADER)
    sample = load(tmp_path)[0]
    assert isinstance(sample, InterleavedSample)
    kinds = [type(x).__name__ for x in sample.sequence]
    assert kinds == ["str", "Tensor", "str", "Tensor"]
    assert sample.sequence[0] == "first" and sample.sequence[1].shape == (3, 6, 8)
    assert float(sample.sequence[3][2].mean()) == 1.0  # blue image


def test_similarity_interleaved_sample_with_audio_and_video(tmp_path, clip):
    mkv = encode_video(container="matroska", seconds=1, audio_codec="flac")
    samples = [
        (
            "m0",
            {
                "png": png((0, 255, 0)),
                "txt": b"a text",
                "a.wav": encode_audio(rate=16000, channels=2, seconds=0.5),
                "b.flac": encode_audio(container="flac", codec="flac", rate=22050, seconds=0.5),
                "mkv": mkv,
            },
        )
    ]
    yaml_text = SAMPLE_LOADER_YAML.format(cls="SimilarityInterleavedSample")
    make_dataset(tmp_path, samples, yaml_text, num_shards=1, loader_script=SIMILARITY_LOADER)
    sample = load(tmp_path)[0]
    assert isinstance(sample, SimilarityInterleavedSample)
    assert [a.get_audio_samples_per_second() for a in sample.audio] == [16000, 22050]
    assert sample.video[0].get_video_duration(get_frame_count=True)[1] == 30
    assert sample.images[0].shape == (3, 6, 8) and sample.texts == ["a text"]


@pytest.fixture()
def corrupt_video_ds(tmp_path, clip):
    samples = [
        (f"c{i}", {"mp4": b"\x00garbage" * 50 if i == 1 else clip, "txt": b"q", "json": b"{}"})
        for i in range(3)
    ]
    yaml_text = VIDQA_YAML.replace("  answers: json[answers]\n", "")
    return make_dataset(tmp_path, samples, yaml_text, num_shards=1)


def test_corrupt_video_is_skipped_with_its_location(corrupt_video_ds, capsys):
    keys = [s.__key__ for s in load(corrupt_video_ds)]
    assert keys == ["c0", "c2"]
    err = capsys.readouterr().err
    assert "media-0000.tar" in err and "'c1'" in err and "byte offset" in err
    assert "AVDecodeError" in err


def test_corrupt_video_raises_with_reraise_policy(corrupt_video_ds):
    with pytest.raises(Exception, match=r"'c1'.*byte offset.*AVDecodeError"):
        load(corrupt_video_ds, global_error_handler=reraise_exception)
