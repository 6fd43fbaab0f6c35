"""Megatron-LM's multimodal data provider pattern runs unchanged on energon through the opt-in alias."""

from __future__ import annotations

import subprocess
import sys
import textwrap

PROVIDER = textwrap.dedent(
    """
    import io, sys, warnings
    import torch
    import energon.megatron_alias  # the one opt-in line
    from megatron.energon import (LimitDataset, RepeatDataset, WorkerConfig, get_loader,
        get_savable_loader, get_train_dataset, get_val_datasets, Batch, CaptioningSample,
        DefaultTaskEncoder, Sample)
    from megatron.energon.task_encoder.base import stateless
    import numpy as np

    class TaskEncoder(DefaultTaskEncoder):
        def __init__(self):
            super().__init__()

        @stateless(restore_seeds=True)
        def encode_sample(self, sample):
            yield {"image": sample.image.mean(), "noise": float(np.random.rand()), "key": sample.__key__}

        def batch(self, samples):
            return {"image": torch.stack([s["image"] for s in samples]), "noise": [s["noise"] for s in samples],
                    "keys": [s["key"] for s in samples]}

        def encode_batch(self, batch):
            return batch

    path = sys.argv[1]
    wc = WorkerConfig(rank=0, world_size=1, num_workers=2, data_parallel_group=None,
                      worker_debug_path=None, worker_log_level=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        train_ds = get_train_dataset(path, batch_size=2, task_encoder=TaskEncoder(), virtual_epoch_length=1000,
            max_samples_per_sequence=100, shuffle_buffer_size=100, worker_config=wc, packing_buffer_size=None,
            handler=print, image_decode="torchrgb")
        val = get_val_datasets(path, split_part="train", batch_size=2, task_encoder=TaskEncoder(), worker_config=wc,
            packing_buffer_size=None, handler=print, image_decode="torchrgb")
    val_wrapped = [LimitDataset(RepeatDataset(ds, worker_config=wc), length=40, worker_config=wc,
                                reset_after_epoch=True) for ds, _src in val]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        train_loader = get_savable_loader(train_ds, worker_config=wc)
        valid_loaders = [get_loader(v, worker_config=wc) for v in val_wrapped]
    it = iter(train_loader)
    for _ in range(3):
        next(it)
    buf = io.BytesIO()
    torch.save({"dataloader_state_dict": train_loader.save_state_rank()}, buf)
    expected = [next(it)["keys"] for _ in range(3)]
    buf.seek(0)
    state = torch.load(buf, map_location="cpu", weights_only=True)["dataloader_state_dict"]
    resumed = get_savable_loader(get_train_dataset(path, batch_size=2, task_encoder=TaskEncoder(),
        virtual_epoch_length=1000, max_samples_per_sequence=100, shuffle_buffer_size=100, worker_config=wc))
    resumed.restore_state_rank(state)
    it2 = iter(resumed)
    assert [next(it2)["keys"] for _ in range(3)] == expected
    passes = [[tuple(b["keys"]) for b in valid_loaders[0]] for _ in range(2)]
    assert len(passes[0]) == 40 and passes[0] == passes[1], "eval repeats data and restarts each time"
    assert len(train_loader) == 1000
    print("OK")
    """
)


def test_megatron_lm_provider_runs_on_energon(captioning_ds):
    out = subprocess.run(
        [sys.executable, "-c", PROVIDER, str(captioning_ds)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("OK")


def test_alias_refuses_to_shadow_a_real_install(tmp_path):
    fake = tmp_path / "site" / "megatron" / "energon"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake.parent / "__init__.py").write_text("")
    code = (
        f"import sys; sys.path.insert(0, {str(tmp_path / 'site')!r}); import energon.megatron_alias"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert "megatron-energon is installed" in out.stderr
