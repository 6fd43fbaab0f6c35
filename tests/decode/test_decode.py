"""SampleDecoder on real encoded media made with Pillow / numpy / torch / PyAV."""

from __future__ import annotations

import gzip
import io
import json
import pickle
import wave

import numpy as np
import pytest
import torch
from PIL import Image

from energon.decode import (
    IMAGE_EXTENSIONS,
    IMAGE_MODES,
    DecodeError,
    SampleDecoder,
    guess_extension,
)

H, W = 6, 10


def _pixels(channels: int) -> np.ndarray:
    """Deterministic, smooth test pattern so lossy codecs stay close to it."""
    y, x = np.mgrid[0:H, 0:W]
    planes = [(x * 20 + 10) % 256, (y * 30 + 5) % 256, np.full((H, W), 128), np.full((H, W), 200)]
    return np.stack(planes[:channels], axis=-1).astype(np.uint8).squeeze()


def _encode(pixels: np.ndarray, pil_mode: str, fmt: str, **options) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(pixels, pil_mode).save(buf, fmt, **options)
    return buf.getvalue()


PNG_RGB = _encode(_pixels(3), "RGB", "PNG")
PNG_RGBA = _encode(_pixels(4), "RGBA", "PNG")
PNG_L = _encode(_pixels(1), "L", "PNG")
JPEG_RGB = _encode(_pixels(3), "RGB", "JPEG", quality=95, subsampling=0)
WEBP_RGB = _encode(_pixels(3), "RGB", "WEBP", lossless=True)

EXPECTED = {
    # mode: (type, dtype, shape for an RGB/RGBA/L input)
    "l8": (np.ndarray, np.uint8, (H, W)),
    "rgb8": (np.ndarray, np.uint8, (H, W, 3)),
    "rgba8": (np.ndarray, np.uint8, (H, W, 4)),
    "l": (np.ndarray, np.float32, (H, W)),
    "rgb": (np.ndarray, np.float32, (H, W, 3)),
    "rgba": (np.ndarray, np.float32, (H, W, 4)),
    "torchl8": (torch.Tensor, torch.uint8, (H, W)),
    "torchrgb8": (torch.Tensor, torch.uint8, (3, H, W)),
    "torchrgba8": (torch.Tensor, torch.uint8, (4, H, W)),
    "torchl": (torch.Tensor, torch.float32, (H, W)),
    "torchrgb": (torch.Tensor, torch.float32, (3, H, W)),
    "torch": (torch.Tensor, torch.float32, (3, H, W)),
    "torchrgba": (torch.Tensor, torch.float32, (4, H, W)),
}
PIL_MODES = {"pill": "L", "pil": "RGB", "pilrgb": "RGB", "pilrgba": "RGBA"}


def test_every_image_mode_is_covered():
    # "encoded" (bytes for decoding on the device): tests/decode/test_device_decode.py
    assert set(EXPECTED) | set(PIL_MODES) | {"encoded"} == set(IMAGE_MODES)


@pytest.mark.parametrize("source", [JPEG_RGB, PNG_RGB])
def test_encoded_mode_keeps_the_bytes(source):
    out = SampleDecoder(image_decode="encoded").decode_part("jpg", memoryview(source))
    assert type(out) is bytes and out == source


@pytest.mark.parametrize("mode", list(EXPECTED))
@pytest.mark.parametrize("source", [PNG_RGB, PNG_RGBA, PNG_L], ids=["rgb", "rgba", "l"])
def test_array_modes_shape_dtype_and_range(mode, source):
    kind, dtype, shape = EXPECTED[mode]
    out = SampleDecoder(image_decode=mode).decode_part("png", source)
    assert isinstance(out, kind) and out.dtype == dtype and tuple(out.shape) == shape
    if kind is torch.Tensor:
        assert out.is_contiguous()
        out = out.numpy()
    assert out.flags.writeable
    if out.dtype == np.float32:
        assert 0.0 <= out.min() and out.max() <= 1.0 and out.max() > 0.3
    else:
        assert out.max() > 77


@pytest.mark.parametrize("mode", list(PIL_MODES))
def test_pil_modes(mode):
    out = SampleDecoder(image_decode=mode).decode_part("png", PNG_RGBA)
    assert isinstance(out, Image.Image) and out.mode == PIL_MODES[mode] and out.size == (W, H)


def test_torchrgb_values_are_exactly_pixels_over_255_in_chw_order():
    pixels = _pixels(3)
    out = SampleDecoder().decode_part("png", PNG_RGB)
    expected = torch.from_numpy(pixels.astype(np.float32) / np.float32(255)).permute(2, 0, 1)
    assert torch.equal(out, expected)


def test_uint8_modes_keep_exact_pixels_and_channel_order():
    rgba = SampleDecoder(image_decode="torchrgba8").decode_part("png", PNG_RGBA)
    assert torch.equal(rgba, torch.from_numpy(_pixels(4)).permute(2, 0, 1))
    hwc = SampleDecoder(image_decode="rgb8").decode_part("png", PNG_RGB)
    assert np.array_equal(hwc, _pixels(3))
    gray = SampleDecoder(image_decode="torchl8").decode_part("png", PNG_L)
    assert torch.equal(gray, torch.from_numpy(_pixels(1)))


def test_grayscale_input_is_expanded_to_rgb():
    out = SampleDecoder(image_decode="torchrgb8").decode_part("png", PNG_L)
    assert torch.equal(out[0], out[1]) and torch.equal(out[1], out[2])
    assert torch.equal(out[0], torch.from_numpy(_pixels(1)))


@pytest.mark.parametrize(
    ("part", "data"), [("jpg", JPEG_RGB), ("webp", WEBP_RGB), ("JPEG", JPEG_RGB)]
)
def test_jpeg_and_webp_decode_close_to_source(part, data):
    out = SampleDecoder(image_decode="torchrgb8").decode_part(part, data)
    reference = torch.from_numpy(_pixels(3)).permute(2, 0, 1).int()
    assert out.shape == (3, H, W)
    assert (out.int() - reference).abs().max() <= 12


def test_memoryview_input_and_dotted_part_names():
    out = SampleDecoder().decode_part("frame.0.png", memoryview(PNG_RGB))
    assert out.shape == (3, H, W)


def test_full_size_decode_of_large_jpeg():
    big = _encode(np.zeros((600, 800, 3), np.uint8), "RGB", "JPEG")
    assert SampleDecoder().decode_part("jpg", big).shape == (3, 600, 800)


def test_image_extension_list_matches_reference():
    assert {
        "jpg",
        "jpeg",
        "png",
        "webp",
        "tif",
        "tiff",
        "gif",
        "bmp",
        "ppm",
        "jp2",
    } <= IMAGE_EXTENSIONS
    assert "txt" not in IMAGE_EXTENSIONS and "mp4" not in IMAGE_EXTENSIONS


def test_basic_formats():
    dec = SampleDecoder()
    assert dec.decode_part("txt", "héllo".encode()) == "héllo"
    assert dec.decode_part("transcript", b"t") == "t"
    assert dec.decode_part("cls", b" 42\n") == 42
    assert dec.decode_part("index", memoryview(b"7")) == 7
    assert dec.decode_part("json", memoryview(b'{"a": [1, 2]}')) == {"a": [1, 2]}
    assert dec.decode_part("meta.jsn", b"[1]") == [1]


def test_basic_extensions_are_case_sensitive():
    assert SampleDecoder().decode_part("TXT", b"abc") == b"abc"


def test_numpy_and_torch_formats():
    dec = SampleDecoder()
    array = np.arange(6, dtype=np.int16).reshape(2, 3)
    buf = io.BytesIO()
    np.save(buf, array)
    assert np.array_equal(dec.decode_part("npy", buf.getvalue()), array)
    buf = io.BytesIO()
    np.savez(buf, a=array, b=np.ones(2))
    decoded = dec.decode_part("npz", buf.getvalue())
    assert set(decoded) == {"a", "b"} and np.array_equal(decoded["a"], array)
    buf = io.BytesIO()
    torch.save({"w": torch.arange(3)}, buf)
    assert torch.equal(dec.decode_part("pth", buf.getvalue())["w"], torch.arange(3))


class _Custom:
    def __init__(self, value):
        self.value = value


def test_pickle_is_refused_by_default_with_a_hint():
    dec = SampleDecoder()
    for part in ("pyd", "pickle", "pkl"):
        with pytest.raises(DecodeError, match=r"allow_pickle=True"):
            dec.decode_part(part, pickle.dumps([1, 2]))


def test_pickle_and_full_torch_load_when_allowed():
    dec = SampleDecoder(allow_pickle=True)
    assert dec.decode_part("pkl", pickle.dumps({"a": 1})) == {"a": 1}
    buf = io.BytesIO()
    torch.save(_Custom(5), buf)
    assert dec.decode_part("pth", buf.getvalue()).value == 5
    with pytest.raises(DecodeError):
        SampleDecoder().decode_part("pth", buf.getvalue())


def test_object_arrays_in_npy_are_refused():
    buf = io.BytesIO()
    np.save(buf, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(DecodeError, match="part 'npy'"):
        SampleDecoder(allow_pickle=True).decode_part("npy", buf.getvalue())


@pytest.mark.parametrize("part", ["ten", "tb", "mp", "msg", "cbor"])
def test_unsupported_formats_fail_clearly(part):
    with pytest.raises(DecodeError, match="not supported"):
        SampleDecoder().decode_part(part, b"\x00")


def test_unknown_extensions_stay_raw_bytes():
    dec = SampleDecoder()
    assert dec.decode_part("bin", b"\x01\x02") == b"\x01\x02"
    out = dec.decode_part("weird", memoryview(b"xyz"))
    assert out == b"xyz" and isinstance(out, bytes)


def test_gzip_is_unwrapped_before_decoding():
    dec = SampleDecoder()
    assert dec.decode_part("txt.gz", gzip.compress(b"zipped")) == "zipped"
    assert dec.decode_part("png.gz", gzip.compress(PNG_RGB)).shape == (3, H, W)
    assert dec.decode_part("bin.gz", gzip.compress(b"\x00\x01")) == b"\x00\x01"


def test_guess_content_uses_magic_bytes():
    assert SampleDecoder().decode_part("blob", PNG_RGB) == PNG_RGB
    guessed = SampleDecoder(guess_content=True)
    assert guessed.decode_part("blob", PNG_RGB).shape == (3, H, W)
    assert guessed.decode_part("data.bin", JPEG_RGB).shape == (3, H, W)
    # Unrecognised content keeps the extension's decoder.
    assert guessed.decode_part("txt", b"plain") == "plain"
    assert guess_extension(WEBP_RGB) == "webp"
    assert guess_extension(b"\x00\x00\x00\x18ftypmp42") == "mp4"
    assert guess_extension(b"hello") is None


def _wav_bytes() -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(8000)
        out.writeframes(np.zeros(800, np.int16).tobytes())
    return buf.getvalue()


def test_av_parts_decode_lazily_and_pyav_mode_opens_container():
    from energon.av import AVDecoder

    wav = _wav_bytes()
    lazy = SampleDecoder().decode_part("wav", memoryview(wav))
    assert isinstance(lazy, AVDecoder) and lazy.has_audio_stream()
    container = SampleDecoder(av_decode="pyav").decode_part("WAV", wav)
    try:
        assert len(container.streams.audio) == 1
    finally:
        container.close()
    assert guess_extension(wav) == "wav"


def test_call_decodes_parts_and_leaves_meta_keys():
    dec = SampleDecoder()
    raw = {"__key__": "s1", "__restore_key__": ("x",), "png": PNG_RGB, "txt": b"cap", "cls": b"3"}
    out = dec(raw)
    assert out["__key__"] == "s1" and out["__restore_key__"] == ("x",)
    assert out["png"].shape == (3, H, W) and out["txt"] == "cap" and out["cls"] == 3


def test_errors_name_sample_key_part_and_cause():
    with pytest.raises(DecodeError) as info:
        SampleDecoder()({"__key__": "s7", "jpg": b"not an image"})
    assert "sample 's7', part 'jpg'" in str(info.value)
    assert info.value.key == "s7" and info.value.part_name == "jpg"
    assert info.value.__cause__ is not None
    assert isinstance(info.value, ValueError)


def test_decode_by_file_name():
    dec = SampleDecoder()
    assert dec.decode("some/dir/000123.txt", b"hi") == "hi"
    assert dec.decode("shard/000123.img.png", PNG_RGB).shape == (3, H, W)
    assert dec.decode("noext", b"raw") == b"raw"


def test_invalid_options_are_rejected():
    with pytest.raises(ValueError, match="image_decode"):
        SampleDecoder(image_decode="rgb16")
    with pytest.raises(ValueError, match="av_decode"):
        SampleDecoder(av_decode="ffmpeg")


def test_config_and_pickling():
    dec = SampleDecoder(image_decode="pilrgb", guess_content=True)
    assert dec.config() == {
        "type": "SampleDecoder",
        "image_decode": "pilrgb",
        "av_decode": "AVDecoder",
        "video_decode_audio": False,
        "guess_content": True,
        "allow_pickle": False,
    }
    json.dumps(dec.config())
    clone = pickle.loads(pickle.dumps(dec))
    assert clone.config() == dec.config()
    assert clone.decode_part("txt", b"ok") == "ok"
