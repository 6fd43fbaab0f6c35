"""`energon report`: one self-contained HTML page, checked in a real headless Chromium (Debian's
package; .ci/run installs it): it renders without script errors and every image (samples, video
thumbnails, plots) loads from the page itself. Image width/height histograms come from prepare's
media metadata when the dataset has it, else from the grid's images."""

from __future__ import annotations

import io
import re
import tarfile

import pytest
from click.testing import CliRunner

from energon.cli.main import main
from energon.demo import write_captioning_shards
from energon.demo.av import encode_audio, encode_video, pick_codec, write_tar_shards
from energon.media.extract import MediaFilterConfig
from energon.plan.rng import CounterRng
from energon.preflight import report
from energon.preflight.simulate import SimulationSettings, build
from energon.prepare.dataset import prepare_dataset
from tests.helpers import browser
from tests.helpers.datasets import CAPTIONING_YAML

needs_chromium = pytest.mark.skipif(
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


@needs_chromium
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
    # not prepared with media metadata: the image sizes are those of the grid's 4 images
    assert "<h2>Image sizes</h2><p>From the images of the sample grid.</p>" in page
    with browser.Browser() as chrome:
        chrome.open(out.as_uri())
        assert chrome.evaluate("document.body.dataset.ready") == "1"
        images = chrome.evaluate(
            "Array.from(document.images).map(i => [i.alt, i.complete, i.naturalWidth])"
        )
        assert chrome.errors() == []
    alts = [alt for alt, _, _ in images]
    assert alts.count("sample image") == 4
    assert alts.count("plot") == 4  # sizes, image sizes, shares, shards
    if has_video:
        assert alts.count("video thumbnail") == 4
    assert all(complete and width > 0 for _, complete, width in images), images


@needs_chromium
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


def test_image_sizes_come_from_prepares_media_metadata(tmp_path):
    """A dataset prepared with media metadata: the widths and heights are those of its images."""
    root = tmp_path / "photos"
    write_captioning_shards(root, num_samples=30, num_shards=2, min_size=24, max_size=64, seed=3)
    media = MediaFilterConfig.parse(extension=True)
    prepare_dataset(
        root, split_parts_ratio=[("train", 1.0)], progress=False, num_workers=1, media_filter=media
    )
    (root / ".nv-meta" / "dataset.yaml").write_text(CAPTIONING_YAML)
    settings = SimulationSettings(world_size=1, num_workers=1, batch_size=2)
    page = report.build_report(str(root), settings, samples=2)
    assert "<h2>Image sizes</h2><p>From prepare&#x27;s media metadata.</p>" in page
    # what the histograms show, against the images themselves (decoded by Pillow)
    from PIL import Image

    actual = {}
    for shard in sorted((root / "parts").glob("*.tar")):
        with tarfile.open(shard) as tar:
            for member in tar.getmembers():
                if member.name.endswith(".jpg"):
                    data = tar.extractfile(member).read()
                    actual[member.name.rsplit(".", 1)[0]] = Image.open(io.BytesIO(data)).size
    spec = build(str(root), settings, "train").spec
    drawn = report._draw(spec, CounterRng(1))
    sizes = report._media_image_sizes(spec, drawn)
    assert list(sizes) == ["jpg"]
    assert len(sizes["jpg"]) == len(drawn[0])
    assert set(sizes["jpg"]) <= set(actual.values())
    assert len(set(actual.values())) > 1  # the images differ in size, so the check means something


def test_the_image_count_counts_the_samples_images_not_the_plots(captioning_ds):
    """Issue 33: the page said "N images" counting its own plots as well."""
    settings = SimulationSettings(world_size=1, num_workers=1, batch_size=2)
    page = report.build_report(str(captioning_ds), settings, samples=3)
    grid = page.split('<div class="grid">', 1)[1].split("</div>\n", 1)[0]
    assert grid.count('alt="sample image"') == 3
    assert page.count("<img") > 3  # the plots are images too
    assert '<p id="image-count">3 images in the sample grid</p>' in page
