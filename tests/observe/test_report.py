"""`energon report`: one self-contained HTML page, checked in a real headless Chromium (Debian's
package; .ci/run installs it): it renders without script errors and every image (samples, video
thumbnails, plots) loads from the page itself."""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner

from energon.cli.main import main
from energon.demo.av import encode_audio, encode_video, pick_codec, write_tar_shards
from energon.format.prepare import prepare_dataset
from tests.helpers import browser

pytestmark = pytest.mark.skipif(
    not browser.available(), reason="chromium is not installed (apt-get install chromium)"
)


@pytest.fixture(scope="module")
def media_ds(tmp_path_factory):
    """Images, audio and video in one dataset (real encodings made by PyAV and Pillow)."""
    import numpy as np

    from energon.demo.datasets import render_photo_like_jpeg

    root = tmp_path_factory.mktemp("media")
    codec = pick_codec("libx264", "mpeg4")
    samples = []
    rng = np.random.default_rng(0)
    for i in range(6):
        parts = {
            "jpg": render_photo_like_jpeg(rng, 40, 30),
            "wav": encode_audio(seconds=0.2),
            "txt": f"sample {i} says hello".encode(),
        }
        if codec is not None:
            parts["mp4"] = encode_video(video_codec=codec, seconds=0.2, fps=10)
        samples.append((f"s{i:03d}", parts))
    write_tar_shards(root, samples, num_shards=2)
    prepare_dataset(root, split_parts_ratio=[("train", 1.0)], progress=False, num_workers=1)
    (root / ".nv-meta" / "dataset.yaml").write_text(
        "__module__: megatron.energon\n__class__: CrudeWebdataset\n"
    )
    return root, codec is not None


def test_report_renders_in_chromium(media_ds, tmp_path):
    root, has_video = media_ds
    out = tmp_path / "report.html"
    result = CliRunner().invoke(
        main,
        [
            "report",
            str(root),
            "-o",
            str(out),
            "--samples",
            "4",
            "--batch-size",
            "2",
            "--no-progress",
        ],
    )
    assert result.exit_code == 0, result.output
    page = out.read_text()
    assert not re.search(r'(src|href)="(?!data:)', page)  # self-contained: nothing fetched
    assert page.count("<audio") == 4
    with browser.Browser() as chrome:
        chrome.open(out.as_uri())
        assert chrome.evaluate("document.body.dataset.ready") == "1"
        images = chrome.evaluate(
            "Array.from(document.images).map(i => [i.alt, i.complete, i.naturalWidth])"
        )
        assert chrome.errors() == []
    alts = [alt for alt, _, _ in images]
    assert alts.count("sample image") == 4
    assert alts.count("plot") == 3
    if has_video:
        assert alts.count("video thumbnail") == 4
    assert all(complete and width > 0 for _, complete, width in images), images


def test_browser_check_catches_script_errors_and_broken_images(tmp_path):
    """The check above can fail: a page with a script error and a broken image is caught."""
    bad = tmp_path / "bad.html"
    bad.write_text(
        '<html><body><img alt="x" src="data:image/png;base64,AAAA">'
        "<script>undefinedFunction();</script></body></html>"
    )
    with browser.Browser() as chrome:
        chrome.open(bad.as_uri())
        images = chrome.evaluate("Array.from(document.images).map(i => i.naturalWidth)")
        assert images == [0]
        assert any("undefinedFunction" in e for e in chrome.errors())
