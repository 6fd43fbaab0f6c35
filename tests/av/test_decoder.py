"""AVDecoder on real media made with PyAV: containers, codecs, timing, seeking, audio, errors."""

from __future__ import annotations

import io
import math
import pickle
import threading

import numpy as np
import pytest
import torch

av = pytest.importorskip("av")

from energon.av import (  # noqa: E402
    AVData,
    AVDecodeError,
    AVDecoder,
    get_clips_uniform,
    get_single_frames_uniform,
)
from energon.av import decoder as decoder_module  # noqa: E402
from energon.deadline import DecodeTimeoutError  # noqa: E402
from energon.demo.av import (  # noqa: E402
    AUDIO_PERIOD,
    audio_ramp,
    encode_audio,
    encode_video,
    frame_number,
    pick_codec,
)
from tests.helpers.avi import avi_with_a_dropped_frame  # noqa: E402

FPS = 30
SECONDS = 3
FRAMES = FPS * SECONDS
H264 = pick_codec("libx264", "h264", "mpeg4")
VP = pick_codec("libvpx-vp9", "libvpx")
OPUS = pick_codec("libopus", "opus")
MP3 = pick_codec("libmp3lame", "mp3")
VFR_STEPS_MS = [50, 20]  # frames alternately last 50 and 20 ms

VIDEO_CASES = {
    "mp4": dict(container="mp4", video_codec=H264, audio_codec="aac"),
    "mkv": dict(container="matroska", video_codec=H264, audio_codec="flac"),
    "avi": dict(container="avi", video_codec="mpeg4", audio_codec="pcm_s16le"),
}
if VP is not None and OPUS is not None:
    VIDEO_CASES["webm"] = dict(container="webm", video_codec=VP, audio_codec=OPUS, audio_rate=48000)


@pytest.fixture(scope="module")
def videos() -> dict[str, bytes]:
    return {
        name: encode_video(seconds=SECONDS, fps=FPS, gop=15, **kwargs)
        for name, kwargs in VIDEO_CASES.items()
    }


@pytest.fixture(scope="module")
def vfr_video() -> bytes:
    return encode_video(
        container="matroska", video_codec=H264, seconds=SECONDS, frame_steps_ms=VFR_STEPS_MS
    )


def numbers(clip: torch.Tensor) -> list[int]:
    return [frame_number(frame.numpy()) for frame in clip]


# ---------------------------------------------------------------------------------------------
# video


@pytest.mark.parametrize("name", list(VIDEO_CASES))
def test_stream_facts(videos, name):
    decoder = AVDecoder(videos[name])
    assert decoder.has_video_stream() and decoder.has_audio_stream()
    assert decoder.get_video_fps() == pytest.approx(FPS)
    seconds, frames = decoder.get_video_duration(get_frame_count=True)
    assert frames == FRAMES
    assert seconds == pytest.approx(SECONDS, abs=0.01)
    assert decoder.get_video_duration()[1] is None
    assert decoder.get_audio_duration() == pytest.approx(SECONDS, abs=0.03)


@pytest.mark.parametrize("name", list(VIDEO_CASES))
def test_clips_by_seconds_hold_the_right_frames(videos, name):
    decoder = AVDecoder(videos[name])
    clips, spans = decoder.get_video_clips([(0.0, 0.2), (1.0, 1.5), (2.9, 10.0)])
    assert numbers(clips[0]) == list(range(0, 7))  # frame 6 starts at 0.2 (inclusive end)
    assert numbers(clips[1]) == list(range(30, 46))
    assert numbers(clips[2]) == [87, 88, 89]  # clipped at the end of the video
    assert clips[1].shape == (16, 3, 48, 64) and clips[1].dtype == torch.uint8
    assert spans[0][0] == pytest.approx(0.0)
    assert spans[1] == pytest.approx((1.0, 46 / FPS), abs=2e-3)
    assert spans[2][1] == pytest.approx(SECONDS, abs=2e-3)


@pytest.mark.parametrize("name", list(VIDEO_CASES))
def test_clips_by_frames_resize_and_out_of_range(videos, name):
    decoder = AVDecoder(videos[name])
    clips, spans = decoder.get_video_clips(
        [(10, 20), (200, 210), (89, 95)], video_unit="frames", video_out_frame_size=(32, 24)
    )
    assert len(clips) == 2  # the range starting after the last frame yields nothing
    assert numbers(clips[0]) == list(range(10, 21))
    assert clips[0].shape == (11, 3, 24, 32)
    assert numbers(clips[1]) == [89]
    assert spans[0][0] == pytest.approx(10 / FPS, abs=2e-3)


def test_backward_and_repeated_requests(videos):
    decoder = AVDecoder(videos["mp4"])
    clips, _ = decoder.get_video_clips([(2.0, 2.1), (0.5, 0.55), (0.5, 0.55), (0.6, 0.6)])
    assert [numbers(c) for c in clips] == [[60, 61, 62, 63], [15, 16], [15, 16], [18]]


def test_a_late_clip_decodes_only_from_the_keyframe_before_it(videos, monkeypatch):
    decoded = []
    monkeypatch.setattr(decoder_module, "check_deadline", lambda: decoded.append(1))
    decoder = AVDecoder(videos["mkv"])
    clips, _ = decoder.get_video_clips([(2.5, 2.6)])
    assert numbers(clips[0]) == [75, 76, 77, 78]
    # keyframes every 15 frames: frame 75 is one; decoding everything would take 90 frames
    assert len(decoded) <= 15 + 5


def test_avi_frame_count_is_the_decodable_frames():
    data = avi_with_a_dropped_frame(20)
    with av.open(io.BytesIO(data)) as container:
        assert container.streams.video[0].frames == 21  # what the header says
    decoder = AVDecoder(data)
    assert decoder.get_video_duration(get_frame_count=True)[1] == 20
    assert decoder.get_metadata().video_num_frames == 20
    assert decoder.get_video().video_clips[0].shape[0] == 20


def test_avi_uses_a_probed_keyframe_index(videos):
    decoder = AVDecoder(videos["avi"])
    assert decoder._needs_probe
    clips, _ = decoder.get_video_clips([(1.7, 1.75), (0.1, 0.1)])
    assert [numbers(c) for c in clips] == [[51, 52], [3]]
    index = decoder._indices[decoder._facts().video.index]
    assert index.num_frames == FRAMES
    keyframes = index.keyframe_pts  # AVI timestamps count frames (time base 1/30)
    assert keyframes[0] == 0 and all(0 < b - a <= 15 for a, b in zip(keyframes, keyframes[1:]))
    assert index.search_timestamp(keyframes[2]) == 2
    assert index.search_timestamp(keyframes[2] + 1) == 2
    assert index.search_timestamp(keyframes[2] + 1, backward=False) == 3
    assert index.entries[keyframes[1]] == (keyframes[1], True)
    assert index.entries[keyframes[1] + 1] == (keyframes[1] + 1, False)


def test_variable_frame_rate_uses_each_frames_timestamp(vfr_video):
    decoder = AVDecoder(vfr_video)
    starts_ms = np.cumsum([0] + [VFR_STEPS_MS[i % 2] for i in range(FRAMES - 1)])
    seconds, frames = decoder.get_video_duration(get_frame_count=True)
    assert frames == FRAMES
    # the last frame lasts as long as the encoder's timestamps say (the container's rounding)
    assert seconds == pytest.approx(
        (starts_ms[-1] + VFR_STEPS_MS[(FRAMES - 1) % 2]) / 1000, abs=0.04
    )
    clips, spans = decoder.get_video_clips([(1.0, 1.2)])
    expected = [
        i
        for i in range(FRAMES)
        if starts_ms[i] <= 1200 and (i + 1 >= FRAMES or starts_ms[i + 1] > 1000)
    ]
    assert numbers(clips[0]) == expected
    assert spans[0][0] == pytest.approx(starts_ms[expected[0]] / 1000)
    clips, spans = decoder.get_video_clips([(40, 41)], video_unit="frames")
    assert numbers(clips[0]) == [40, 41]
    assert spans[0][0] == pytest.approx(starts_ms[40] / 1000)


def test_uniform_frames_and_clips(videos):
    decoder = AVDecoder(videos["mkv"])
    frames, starts = get_single_frames_uniform(
        decoder, 5, video_out_frame_size=(16, 12), return_timestamps=True
    )
    assert frames.shape == (5, 3, 12, 16)
    assert [frame_number(f.numpy()) for f in get_single_frames_uniform(decoder, 5)] == [
        0,
        22,
        45,
        67,
        89,
    ]
    assert starts[0] == pytest.approx(0.0) and starts == sorted(starts)
    data = get_clips_uniform(decoder, 0.5, 3, request_video=True, request_audio=True)
    assert isinstance(data, AVData)
    assert [numbers(c)[0] for c in data.video_clips] == [0, 37, 75]
    assert [c.shape for c in data.audio_clips] == [(2, 8000)] * 3
    with pytest.raises(ValueError, match="request_video"):
        get_clips_uniform(decoder, 0.5, 3)


def test_whole_streams_and_metadata(videos):
    decoder = AVDecoder(videos["mkv"])
    whole = decoder.get_video_with_audio()
    assert whole.video_clips[0].shape == (FRAMES, 3, 48, 64)
    assert whole.audio_clips[0].shape == (2, SECONDS * 16000)
    assert decoder.get_frames().audio_clips is None
    assert decoder.get_frames(video_decode_audio=True).audio_clips[0].shape[1] == SECONDS * 16000
    meta = decoder.get_metadata(get_audio_num_samples=True)
    assert (meta.video_width, meta.video_height, meta.video_num_frames) == (64, 48, FRAMES)
    assert meta.video_fps == pytest.approx(FPS) and meta.video_duration == pytest.approx(SECONDS)
    assert (meta.audio_channels, meta.audio_sample_rate) == (2, 16000)
    assert meta.audio_num_samples == SECONDS * 16000
    assert decoder.get_metadata(get_video=False).video_fps is None


# ---------------------------------------------------------------------------------------------
# audio


def test_audio_and_video_clips_are_in_sync(videos):
    """Frame n shows time n/30, audio sample m plays at m/16000: both clips must agree."""
    decoder = AVDecoder(videos["mkv"])
    data = decoder.get_clips(
        video_clip_ranges=[(1.0, 1.5), (2.2, 2.4)], audio_clip_ranges=[(1.0, 1.5), (2.2, 2.4)]
    )
    for video, audio, vspan, aspan in zip(
        data.video_clips, data.audio_clips, data.video_timestamps, data.audio_timestamps
    ):
        first_frame_time = numbers(video)[0] / FPS
        expected_sample = round(first_frame_time * 16000) % AUDIO_PERIOD
        assert abs(int(audio[0, 0]) - expected_sample) <= 16000 / FPS
        assert vspan[0] == pytest.approx(aspan[0], abs=1 / FPS)


WAV_FORMATS = [
    ("pcm_s16le", 8000, 1, torch.int16),
    ("pcm_s16le", 44100, 2, torch.int16),
    ("pcm_s24le", 22050, 2, torch.int32),
    ("pcm_s32le", 16000, 1, torch.int32),
    ("pcm_f32le", 48000, 1, torch.float32),
    ("pcm_u8", 11025, 2, torch.uint8),
]


@pytest.mark.parametrize("codec,rate,channels,dtype", WAV_FORMATS)
def test_wav_fast_path_matches_pyav(codec, rate, channels, dtype):
    data = encode_audio(container="wav", codec=codec, rate=rate, channels=channels, seconds=1.0)
    fast = AVDecoder(data)
    assert fast._wav is not None
    slow = AVDecoder(data)
    slow._wav = None
    slow._header = None
    ranges = [(0.0, 0.25), (0.5, 0.75), (0.9, math.inf), (2.0, 3.0)]
    fast_clips, fast_spans = fast.get_audio_clips(ranges)
    slow_clips, slow_spans = slow.get_audio_clips(ranges)
    assert len(fast_clips) == len(slow_clips) == 3
    for a, b in zip(fast_clips, slow_clips):
        assert a.dtype == b.dtype == dtype
        assert torch.equal(a, b)
    assert np.allclose(fast_spans, slow_spans)
    assert fast_clips[0].shape == (channels, round(0.25 * rate))
    assert fast.get_audio_samples_per_second() == rate
    assert fast.get_metadata(get_audio_num_samples=True).audio_num_samples == rate
    assert not fast.has_video_stream()


def test_flac_clips_are_sample_exact_by_seconds_and_samples():
    data = encode_audio(container="flac", codec="flac", rate=22050, channels=2, seconds=2.0)
    decoder = AVDecoder(data)
    clips, spans = decoder.get_audio_clips([(0.5, 1.0), (1.0, 1.5), (1.9, 5.0)])
    assert torch.equal(clips[0], torch.from_numpy(audio_ramp(11025, 11025, 2)))
    assert torch.equal(clips[1], torch.from_numpy(audio_ramp(22050, 11025, 2)))
    assert clips[2].shape == (2, 44100 - round(1.9 * 22050))
    assert spans[1] == pytest.approx((1.0, 1.5))
    clips, _ = decoder.get_audio_clips([(100, 199)], audio_unit="samples")
    assert torch.equal(clips[0], torch.from_numpy(audio_ramp(100, 100, 2)))


@pytest.mark.parametrize(
    "container,codec,rate",
    [("mp3", MP3, 22050), ("ogg", OPUS, 48000), ("ogg", "flac", 32000)],
)
def test_lossy_and_ogg_audio_clip_shapes(container, codec, rate):
    if codec is None:
        pytest.skip("encoder not available in this PyAV build")
    data = encode_audio(container=container, codec=codec, rate=rate, channels=1, seconds=2.0)
    decoder = AVDecoder(data)
    assert decoder.get_audio_samples_per_second() == rate
    assert decoder.get_audio_duration() == pytest.approx(2.0, abs=0.05)
    clips, _ = decoder.get_audio_clips([(0.0, 0.5), (0.7, 1.2), (1.2, 1.7)])
    assert [c.shape for c in clips] == [(1, rate // 2)] * 3


# ---------------------------------------------------------------------------------------------
# robustness


def test_pickled_decoder_still_decodes(videos):
    decoder = AVDecoder(videos["mp4"], name="k.mp4")
    decoder.get_video_duration(get_frame_count=True)
    clone = pickle.loads(pickle.dumps(decoder))
    assert numbers(clone.get_video_clips([(0, 0)], "frames")[0][0]) == [0]
    assert repr(clone).startswith("AVDecoder(k.mp4")


def test_corrupt_and_truncated_media_raise_clear_errors(videos):
    with pytest.raises(AVDecodeError, match=r"check of bad\.mp4"):
        AVDecoder(b"\x00" * 500, name="bad.mp4").check()
    with pytest.raises(AVDecodeError):
        AVDecoder(videos["mp4"][: len(videos["mp4"]) // 2]).get_video_clips([(0, 1)])
    truncated = AVDecoder(videos["mkv"][: len(videos["mkv"]) // 2])
    try:  # the header survives: decoding must stop early or fail cleanly, never crash
        clips, _ = truncated.get_video_clips([(0, 10)])
        assert clips[0].shape[0] < FRAMES
    except AVDecodeError:
        pass
    with pytest.raises(TypeError):
        AVDecoder("not bytes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unit"):
        AVDecoder(videos["mp4"]).get_video_clips([(0, 1)], video_unit="minutes")  # type: ignore[arg-type]
    with pytest.raises(AVDecodeError, match="no video stream"):
        AVDecoder(encode_audio(seconds=0.2)).get_video_clips([(0, 1)])


def test_timeout_bounds_clip_extraction(videos, monkeypatch):
    convert = decoder_module.video_frame_to_array

    def slow_convert(frame, *args):
        threading.Event().wait(0.05)
        return convert(frame, *args)

    monkeypatch.setattr(decoder_module, "video_frame_to_array", slow_convert)
    # 90 frames take at least 4.5 s, over twice the timeout; the 2 frames of the short request
    # take 0.1 s, a twentieth of it (a busy machine only makes the slow one slower)
    decoder = AVDecoder(videos["mp4"], timeout=2.0, name="slow.mp4")
    with pytest.raises(DecodeTimeoutError, match=r"get_video_clips of slow\.mp4"):
        decoder.get_video_clips([(0, 3)])
    assert decoder.get_video_clips([(0, 0.05)])[0][0].shape[0] == 2  # short requests still work


def test_codec_threads_are_bounded(videos):
    from energon.av._pyav import open_container

    container = open_container(videos["mp4"], 1)
    try:
        context = container.streams.video[0].codec_context
        assert context.thread_count == 1 and "NONE" in str(context.thread_type).upper()
    finally:
        container.close()
    assert AVDecoder(videos["mp4"], codec_threads=2).get_video_clips([(0, 0.1)])[0]


# ---------------------------------------------------------------------------------------------
# equal to a direct PyAV decode; the header's container is reused


def _direct_pyav_clip(data: bytes, start: float, end: float, size=None) -> torch.Tensor:
    """The clip by the documented rule, decoding every frame from the start with plain PyAV:
    the frame showing at ``start`` plus every frame starting up to ``end``, RGB (F, 3, H, W)."""
    container = av.open(io.BytesIO(data))
    try:
        stream = container.streams.video[0]
        covering, chosen = None, []
        for frame in container.decode(stream):
            t = float(frame.pts * stream.time_base)
            if t <= start:
                covering = frame
                continue
            if not chosen and covering is not None:
                chosen.append(covering)
            if t > end:
                break
            chosen.append(frame)
        if size is None:
            arrays = [f.to_ndarray(format="rgb24") for f in chosen]
        else:  # scaled and converted to RGB in one swscale pass
            arrays = [
                f.reformat(
                    width=size[0], height=size[1], format="rgb24", interpolation="BILINEAR"
                ).to_ndarray()
                for f in chosen
            ]
        return torch.from_numpy(np.stack(arrays)).permute(0, 3, 1, 2).contiguous()
    finally:
        container.close()


@pytest.fixture(scope="module")
def textured_videos() -> dict[str, bytes]:
    """Videos with a moving random texture: every pixel matters, not just the frame number."""
    return {
        name: encode_video(seconds=SECONDS, fps=FPS, gop=15, texture_seed=7, **kwargs)
        for name, kwargs in VIDEO_CASES.items()
    }


@pytest.mark.parametrize("name", list(VIDEO_CASES))
@pytest.mark.parametrize("size", [None, (40, 30)])
def test_clips_equal_a_direct_pyav_decode(textured_videos, name, size):
    data = textured_videos[name]
    ranges = [(0.0, 0.5), (1.25, 1.75), (2.5, 3.0), (0.4, 0.6)]  # forward seeks, then back
    decoder = AVDecoder(data)
    decoder.check()  # as the sample decoder does at load time
    clips, _ = decoder.get_video_clips(ranges, video_out_frame_size=size)
    for clip, (start, end) in zip(clips, ranges, strict=True):
        expected = _direct_pyav_clip(data, start, end, size)
        assert clip.shape == expected.shape and clip.is_contiguous()
        assert torch.equal(clip, expected)


def test_the_header_container_serves_the_first_request_and_is_never_pickled(videos, monkeypatch):
    opened = []
    real_open = decoder_module.open_container
    monkeypatch.setattr(
        decoder_module, "open_container", lambda *a: opened.append(1) or real_open(*a)
    )
    decoder = AVDecoder(videos["mp4"], name="k.mp4")
    decoder.check()
    clone = pickle.loads(pickle.dumps(decoder))  # an open container would not pickle
    first = decoder.get_video_clips([(1.0, 1.2)])[0][0]
    assert len(opened) == 1  # check and the first request shared one container
    again = decoder.get_video_clips([(1.0, 1.2)])[0][0]
    assert len(opened) == 2  # later requests open their own
    assert torch.equal(first, again) and torch.equal(
        first, clone.get_video_clips([(1.0, 1.2)])[0][0]
    )
    assert numbers(first) == list(range(30, 37))
