"""``megatron.energon.transforms``: a merged chain of torchvision transforms gives the image that
applying them one after another gives (same seed), for PIL images and tensors, and a user's
``CustomTransform`` joins the chain.

torchvision does not import beside the project's CPU torch, so the comparison runs in a side venv
(``.cache/tv-venv``: torch 2.14.1 + torchvision 0.29.1, created on first use; skipped with the
reason printed only when it cannot be created). The module itself imports without torchvision,
which is checked in the project venv.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.helpers.paths import REPO_ROOT
from tests.helpers.side_venv import ensure_venv

pytestmark = pytest.mark.compat

TV_VENV = REPO_ROOT / ".cache" / "tv-venv"
TV_READY = TV_VENV / ".energon-tv-ready"
# torchvision's wheels pin their torch; these two lie on the machines' local package disk
TV_PIP_STEPS = (("torch==2.14.1", "torchvision==0.29.1"),)


@pytest.fixture(scope="module")
def tv_python() -> str:
    if os.environ.get("ENERGON_SKIP_COMPAT"):
        pytest.skip("ENERGON_SKIP_COMPAT is set")
    reason = ensure_venv(TV_VENV, TV_PIP_STEPS, TV_READY, needs_gib=5.5)
    if reason is not None:
        print(f"skipping the torchvision comparison: {reason}")
        pytest.skip(f"cannot create the torchvision side venv: {reason}")
    return str(TV_VENV / "bin" / "python")


def _run(python: str, script: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(REPO_ROOT)
    proc = subprocess.run(
        [python, "-c", script], capture_output=True, text=True, timeout=600, env=env, cwd="/"
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


COMPARE_SCRIPT = r"""
import json
import numpy as np, torch, PIL.Image
import torchvision.transforms as T
import torchvision.transforms.functional as F
import energon.megatron_alias  # noqa: F401
from megatron.energon.transforms import CustomTransform, MergeTransform

# a smooth picture: one warp and a chain of resamplings agree up to rounding on it
yy, xx = np.mgrid[0:60, 0:80]
pixels = np.stack([127 + 100 * np.sin(xx / 9.0), 127 + 100 * np.cos(yy / 7.0),
                   (xx + yy) * 1.4], -1).astype(np.uint8)
image = PIL.Image.fromarray(pixels)
tensor = torch.from_numpy(pixels).permute(2, 0, 1).float()

def as_array(x):
    return np.asarray(x).astype(float) if isinstance(x, PIL.Image.Image) else x.double().numpy()

def difference(chain, source, seed):
    torch.manual_seed(seed)
    merged = as_array(MergeTransform(chain)(source))
    torch.manual_seed(seed)
    expected = source
    for t in chain:
        expected = t(expected)
    expected = as_array(expected)
    assert merged.shape == expected.shape, (merged.shape, expected.shape)
    d = np.abs(merged - expected)
    return {"shape": list(merged.shape), "max": float(d.max()), "p99.5": float(np.percentile(d, 99.5))}

B = T.InterpolationMode.BILINEAR
chains = {
    "resize_centercrop": [T.Resize(90), T.CenterCrop(64)],
    "resize_max_size": [T.Resize(50, max_size=60), T.RandomHorizontalFlip(0.5)],
    "resized_crop_flip": [T.RandomResizedCrop(48, scale=(0.5, 1.0)), T.RandomHorizontalFlip()],
    "crop_flips": [T.RandomCrop(50), T.RandomVerticalFlip(), T.RandomHorizontalFlip()],
    "crop_padding": [T.RandomCrop((64, 70), padding=(3, 5)), T.RandomHorizontalFlip()],
    "crop_pad_if_needed": [T.RandomCrop(70, pad_if_needed=True)],
    "rotate_then_crop": [T.Resize(100), T.RandomRotation(20, interpolation=B), T.CenterCrop(70)],
    "rotate_expand": [T.RandomRotation(25, interpolation=B, expand=True)],
    "rotate_center": [T.RandomRotation(25, interpolation=B, center=(10, 20))],
    "perspective": [T.RandomPerspective(0.3, p=1.0), T.RandomCrop(50)],
}
out = {}
for name, chain in chains.items():
    for seed in (0, 1):
        out[f"pil/{name}/{seed}"] = difference(chain, image, seed)
        out[f"tensor/{name}/{seed}"] = difference(chain, tensor, seed)

# uint8 tensors keep their dtype (the reference's warp fails on them)
torch.manual_seed(0)
u8 = MergeTransform([T.Resize(90), T.CenterCrop(64)])(torch.from_numpy(pixels).permute(2, 0, 1))
out["uint8_dtype"] = str(u8.dtype)

class Shift(CustomTransform):
    # a user's own step: move the picture right by dx pixels
    def __init__(self, dx):
        self.dx = dx

    def apply_transform(self, matrix, dst_size):
        return self.translate(self.dx, 0) @ matrix, dst_size, ("Shift", self.dx)

torch.manual_seed(5)
merged = as_array(MergeTransform([T.Resize(90), Shift(7), T.CenterCrop(64)])(image))
torch.manual_seed(5)
step = T.CenterCrop(64)(F.affine(T.Resize(90)(image), angle=0.0, translate=[7, 0], scale=1.0, shear=[0.0]))
out["custom"] = {"max": float(np.abs(merged - as_array(step)).max()),
                 "moved": float(np.abs(merged - as_array(T.CenterCrop(64)(T.Resize(90)(image)))).max())}

errors = {}
for name, chain in {"unsupported": [T.Resize(10), T.ToTensor()],
                    "interpolation": [T.Resize(10), T.RandomRotation(10)],
                    "fill": [T.RandomRotation(10, fill=3), T.RandomCrop(5)]}.items():
    try:
        MergeTransform(chain)
        errors[name] = None
    except ValueError as e:
        errors[name] = str(e)
out["errors"] = errors
print(json.dumps(out))
"""


def test_merged_chain_matches_applying_the_transforms_one_by_one(tv_python):
    out = _run(tv_python, COMPARE_SCRIPT)
    results = {k: v for k, v in out.items() if "/" in k}
    assert len(results) == 40
    for name, r in results.items():
        if "perspective" in name:
            # a perspective warp's edge against the fill: a few boundary pixels differ
            assert r["p99.5"] <= 2, (name, r)
        else:
            assert r["max"] <= 2, (name, r)
    assert out["uint8_dtype"] == "torch.uint8"
    assert out["custom"]["max"] <= 2 and out["custom"]["moved"] > 50
    errors = out["errors"]
    assert "ToTensor cannot be merged" in errors["unsupported"]
    assert "Interpolation modes are not equal" in errors["interpolation"]
    assert "Fill values are not equal" in errors["fill"]


def test_module_imports_without_torchvision_and_says_what_is_missing():
    code = (
        "import sys\n"
        "sys.modules['torchvision'] = None  # as on a machine without it\n"
        "import energon.megatron_alias\n"
        "import megatron.energon.transforms as t, megatron.energon.transforms.merge as m\n"
        "assert t is m and t.TransformMapper.hflip()[0][0] == -1.0\n"
        "try:\n"
        "    t.MergeTransform([])\n"
        "except ModuleNotFoundError as e:\n"
        "    print(e.name, 'pip install' in str(e))\n"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["torchvision", "True"]
