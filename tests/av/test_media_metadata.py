"""Media metadata: records, filters, preparation (prepare / prepare-media) and lookup."""

from __future__ import annotations

import io
import pickle
import sqlite3

import pytest
from click.testing import CliRunner
from PIL import Image

av = pytest.importorskip("av")

from energon.cli.main import cli  # noqa: E402
from energon.demo.av import encode_audio, encode_video, write_tar_shards  # noqa: E402
from energon.media import (  # noqa: E402
    AVMetadata,
    ImageMetadata,
    MediaFilterConfig,
    MediaFilterStrategy,
    MediaMetadataReader,
    deserialize_media_metadata,
    get_media_metadata,
    serialize_media_metadata,
)
from energon.prepare.dataset import prepare_dataset  # noqa: E402


def image(size=(32, 16), fmt="JPEG") -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, (10, 20, 30)).save(buf, fmt)
    return buf.getvalue()


@pytest.fixture(scope="module")
def media() -> dict[str, bytes]:
    return {
        "mp4": encode_video(seconds=1, audio_codec="aac"),
        "flac": encode_audio(container="flac", codec="flac", rate=32000, seconds=0.5),
        "jpg": image(),
        "png": image((24, 24), "PNG"),
    }


def write_samples(root, media):
    samples = [
        (
            f"s{i}",
            {
                "mp4": media["mp4"],
                "flac": media["flac"],
                "jpg": media["jpg"],
                "bin": media["png"],  # an image behind a meaningless extension
                "txt": b"not media",
            },
        )
        for i in range(3)
    ]
    write_tar_shards(root, samples, num_shards=2)


def rows(root) -> dict[str, tuple[str, str]]:
    with sqlite3.connect(root / ".nv-meta" / "index.sqlite") as db:
        return {k: (t, j) for k, t, j in db.execute("SELECT * FROM media_metadata")}


def test_serialisation_is_compact_json_of_set_fields():
    meta = AVMetadata(video_duration=2.5, video_fps=30.0, audio_channels=2)
    kind, text = serialize_media_metadata(meta)
    assert (kind, text) == ("av", '{"video_duration":2.5,"video_fps":30.0,"audio_channels":2}')
    assert deserialize_media_metadata(kind, text) == meta
    kind, text = serialize_media_metadata(ImageMetadata(width=3, height=4))
    assert text == '{"width":3,"height":4,"format":"UNKNOWN","mode":"UNKNOWN"}'
    assert deserialize_media_metadata("image", '{"width":3,"height":4,"new":1}').height == 4
    with pytest.raises(ValueError, match="unknown media metadata type"):
        deserialize_media_metadata("hologram", "{}")


def test_filter_options():
    assert MediaFilterConfig.parse(extension=True).strategy is MediaFilterStrategy.EXTENSION
    glob = MediaFilterConfig.parse(glob="*.MP4, clips/*.wav")
    assert glob.patterns == ("*.mp4", "clips/*.wav") and glob.patterns_column == "*.mp4,clips/*.wav"
    assert glob.candidate_type("A.Mp4") is not None and glob.candidate_type("a.jpg") is None
    for bad in ({}, {"extension": True, "header": True}, {"glob": " , "}):
        with pytest.raises(ValueError):
            MediaFilterConfig.parse(**bad)


def test_prepare_by_extension_and_lookup(tmp_path, media):
    write_samples(tmp_path, media)
    prepare_dataset(
        tmp_path,
        media_filter=MediaFilterConfig.parse(extension=True),
        progress=False,
        num_workers=2,
    )
    video = get_media_metadata(tmp_path, "s1.mp4")
    assert (video.video_width, video.video_height, video.video_num_frames) == (64, 48, 30)
    assert video.video_fps == pytest.approx(30) and video.video_duration == pytest.approx(1.0)
    assert video.audio_sample_rate == 16000 and video.audio_channels == 2
    audio = get_media_metadata(tmp_path, "s2.flac")
    assert (audio.audio_duration, audio.audio_sample_rate, audio.audio_num_samples) == (
        0.5,
        32000,
        16000,
    )
    assert audio.video_duration is None
    assert get_media_metadata(tmp_path, "s0.jpg") == ImageMetadata(32, 16, "JPEG", "RGB")
    with pytest.raises(KeyError, match="exists .* but has no media metadata"):
        get_media_metadata(tmp_path, "s0.bin")  # not selected by extension
    with pytest.raises(KeyError, match="not found"):
        get_media_metadata(tmp_path, "s9.mp4")
    with sqlite3.connect(tmp_path / ".nv-meta" / "index.sqlite") as db:
        assert db.execute("SELECT strategy, patterns FROM media_filters").fetchall() == [
            ("EXTENSION", "")
        ]
    # a plain re-prepare keeps the metadata
    prepare_dataset(tmp_path, progress=False, num_workers=1)
    assert len(rows(tmp_path)) == 9


def test_dataset_without_media_metadata_says_how_to_add_it(tmp_path, media):
    write_samples(tmp_path, media)
    prepare_dataset(tmp_path, progress=False, num_workers=1)
    with pytest.raises(RuntimeError, match="--media-metadata-by-extension"):
        get_media_metadata(tmp_path, "s0.mp4")
    with pytest.raises(RuntimeError, match="prepare-media"):
        MediaMetadataReader(tmp_path / "nowhere").get("x.mp4")


def test_cli_prepare_by_glob_then_prepare_media_by_header(tmp_path, media):
    write_samples(tmp_path, media)
    runner = CliRunner()
    result = runner.invoke(
        cli,
        [
            "prepare",
            str(tmp_path),
            "--non-interactive",
            "--split-ratio",
            "1,0,0",
            "--skip-dataset-yaml",
            "--no-progress",
            "--num-workers",
            "1",
            "--media-metadata-by-glob",
            "*.mp4",
        ],
    )
    assert result.exit_code == 0, result.output
    assert sorted(rows(tmp_path)) == ["s0.mp4", "s1.mp4", "s2.mp4"]
    result = runner.invoke(
        cli,
        ["prepare-media", str(tmp_path), "--media-metadata-by-header", "--num-workers", "2"],
    )
    assert result.exit_code == 0, result.output
    assert "Done. Stored metadata for 12 files." in result.output
    assert get_media_metadata(tmp_path, "s0.bin") == ImageMetadata(24, 24, "PNG", "RGB")
    assert "s0.txt" not in rows(tmp_path)
    result = runner.invoke(cli, ["prepare-media", str(tmp_path)])
    assert result.exit_code != 0 and "--media-metadata-by-extension" in result.output


def test_prepare_media_on_a_plain_folder(tmp_path, media):
    (tmp_path / "clips" / "deep").mkdir(parents=True)
    (tmp_path / "clips" / "deep" / "a.mp4").write_bytes(media["mp4"])
    (tmp_path / "b.FLAC").write_bytes(media["flac"])
    (tmp_path / "c.jpg").write_bytes(media["jpg"])
    (tmp_path / "broken.mp4").write_bytes(b"\x00" * 100)
    (tmp_path / "notes.txt").write_text("hi")
    result = CliRunner().invoke(
        cli, ["prepare-media", str(tmp_path), "--media-metadata-by-extension", "--no-progress"]
    )
    assert result.exit_code == 0, result.output
    assert "Stored metadata for 3 files" in result.output
    reader = MediaMetadataReader(tmp_path)
    assert reader.get("clips/deep/a.mp4").video_num_frames == 30
    assert pickle.loads(pickle.dumps(reader)).get("b.FLAC").audio_sample_rate == 32000
    with pytest.raises(KeyError, match="exists"):
        reader.get("broken.mp4")  # unparseable: no row, but the file is there
    with pytest.raises(KeyError, match="not found"):
        reader.get("missing.jpg")
    with sqlite3.connect(f"file:{tmp_path}/.nv-meta/index.sqlite?mode=ro", uri=True) as db:
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert "samples" not in tables and "media_metadata" in tables
    result = CliRunner().invoke(cli, ["prepare", str(tmp_path), "--non-interactive"])
    assert "prepare-media" in result.output  # prepare refuses a media folder
