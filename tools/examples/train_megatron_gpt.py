"""Train a tiny megatron-core GPT from energon's loader; save and resume model + loader exactly.

Runs on CPU (gloo) and, unchanged, on GPUs (nccl)::

    python tools/examples/train_megatron_gpt.py --data tokens --iters 6 --save ckpt --save-interval 3 \\
        --log-batches run.jsonl
    python tools/examples/train_megatron_gpt.py --data tokens --iters 6 --load ckpt --ckpt-step 3 \\
        --log-batches resumed.jsonl  # iterations 4-6 again: same batches, losses and weights
    torchrun --standalone --nproc_per_node=2 tools/examples/train_megatron_gpt.py --data captioning ...

What it does (see docs/megatron.md, "Training with megatron-core"):

- data: ``--data tokens`` reads a Megatron ``.bin/.idx`` prefix through ``get_train_dataset(...,
  token_config=GPTConfig(...))``; ``--data captioning`` reads an energon-prepared JPEG+caption
  WebDataset through :class:`CaptionTokenEncoder`. Without ``--data-path`` the script generates a
  small corpus of its own under ``--data-dir`` (JSONL -> byte tokens; or JPEG+caption shards ->
  ``prepare``).
- model: ``GPTModel`` (2 layers, local spec, byte vocabulary), Megatron ``DistributedDataParallel``,
  ``get_megatron_optimizer`` (Adam), ``get_forward_backward_func``; data parallel over all ranks.
- each data-parallel rank has its own savable loader (``WorkerConfig(rank=dp_rank,
  world_size=dp_size)``); one micro-batch is one ``next()``.
- ``--save``: ``dist_checkpointing.save`` of model and optimizer, plus one
  ``train_dataloader_dprank{r:03d}.pt`` per data-parallel rank (plain data, loadable with
  ``torch.load(weights_only=True)``), plus the iteration number. ``--load`` restores all three.
- ``--log-batches FILE``: rank 0 writes one JSON line per iteration with, for every rank, the sample
  keys and a hash of the token ids of each micro-batch it consumed, its loss and a checksum of its
  weights; and one line after each save and load. Two runs are compared by comparing these lines.

The CPU workarounds megatron-core 0.16 needs are all in :func:`apply_cpu_workarounds`, which does
nothing when CUDA is available.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

# Runs from a source checkout without installing energon.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

BYTE_VOCAB = 257  # energon's built-in byte tokenizer: ids 0..255 are UTF-8 bytes, 256 is EOD
EOD = 256
IMAGE_GRID = 2  # the captioning encoder turns an image into IMAGE_GRID**2 pseudo tokens
IMAGE_LEVELS = 16  # ... each one of IMAGE_LEVELS grey levels, ids BYTE_VOCAB .. BYTE_VOCAB+15
CAPTION_VOCAB = BYTE_VOCAB + IMAGE_LEVELS

WORDS = (
    "the a small large red green blue old new quiet busy river mountain city street house garden "
    "window door table cat dog bird horse tree flower cloud sky sun moon boat car train road bridge "
    "market book lamp cup bread apple coffee morning evening night rain snow light shadow sits "
    "stands walks runs flies looks holds near behind beside above below and with"
).split()


# ---------------------------------------------------------------------------------------------
# CPU workarounds (megatron-core 0.16.1 assumes CUDA in a few places; see docs/megatron.md)
# ---------------------------------------------------------------------------------------------


def apply_cpu_workarounds() -> bool:
    """Make megatron-core train on a CUDA-less torch. Returns True if anything was patched.

    Does nothing when CUDA is available: then the example runs megatron-core unmodified.
    """
    if torch.cuda.is_available():
        return False
    from megatron.core.tensor_parallel import random as mp_random
    from torch.overrides import TorchFunctionMode

    # 1. model_parallel_cuda_manual_seed() adds named CUDA RNG states (torch.cuda.get_rng_state
    #    asserts without CUDA). Install a tracker that keeps CPU generator states instead, with the
    #    same names and seeds; fork() swaps the CPU RNG state in and out.
    class CpuRNGStatesTracker(mp_random.CudaRNGStatesTracker):
        def add(self, name: str, seed: int) -> None:
            if seed in self.seeds_ or name in self.states_:
                raise RuntimeError(f"RNG state {name} / seed {seed} already exists")
            self._is_initialized = True
            self.seeds_.add(seed)
            self.states_[name] = torch.Generator().manual_seed(seed).get_state()

        @contextlib.contextmanager
        def fork(self, name: str = mp_random._MODEL_PARALLEL_RNG_TRACKER_NAME):
            outer = torch.get_rng_state()
            torch.set_rng_state(self.states_[name])
            try:
                yield
            finally:
                self.states_[name] = torch.get_rng_state()
                torch.set_rng_state(outer)

    mp_random._CUDA_RNG_STATE_TRACKER = CpuRNGStatesTracker()
    mp_random._CUDA_RNG_STATE_TRACKER_INITIALIZED = True

    # 2. The attention scratch buffer is allocated on torch.cuda.current_device().
    torch.cuda.current_device = lambda: "cpu"

    # 3. The schedule, the DDP grad buffers and the optimizer allocate with device="cuda" (or a
    #    CUDA device index). Rewrite those device arguments to the CPU for the whole process.
    def is_cuda(device: Any) -> bool:
        if isinstance(device, int) and not isinstance(device, bool):
            return True
        if isinstance(device, str):
            return device.startswith("cuda")
        return isinstance(device, torch.device) and device.type == "cuda"

    class CudaDeviceToCpu(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if is_cuda(kwargs.get("device")):
                kwargs = {**kwargs, "device": "cpu"}
            return func(*args, **kwargs)

    CudaDeviceToCpu().__enter__()  # stays active until the process exits

    # 4. Gradient clipping asserts CUDA tensors: the optimizer is built with clip_grad=0 on CPU
    #    (see optimizer_config()).
    # 5. dist_checkpointing.save calls torch.cuda.synchronize() before writing.
    torch.cuda.synchronize = lambda *args, **kwargs: None

    # 6. (megatron-core 0.19) DDP's gradient sync waits for CUDA-graph events on the current CUDA
    #    stream; without CUDA there are no such events, so a stream that waits for nothing will do.
    class CpuStream:
        def wait_event(self, event: Any) -> None:
            pass

        def wait_stream(self, stream: Any) -> None:
            pass

    torch.cuda.current_stream = lambda *args, **kwargs: CpuStream()
    return True


def optimizer_config(lr: float):
    from megatron.core.optimizer import OptimizerConfig

    # CPU workaround 4: clip_grad_by_total_norm_fp32 asserts torch.cuda.FloatTensor gradients.
    clip_grad = 1.0 if torch.cuda.is_available() else 0.0
    return OptimizerConfig(
        optimizer="adam",
        lr=lr,
        weight_decay=0.0,
        clip_grad=clip_grad,
        use_distributed_optimizer=False,
    )


# ---------------------------------------------------------------------------------------------
# Data: generation (only without --data-path), task encoder, loader
# ---------------------------------------------------------------------------------------------


def generate_tokens(root: Path, num_docs: int = 300, seed: int = 0) -> str:
    """Random word documents as JSONL, byte-tokenized with ``energon preprocess``'s function."""
    from energon.megatron.preprocess import preprocess_jsonl

    prefix = root / "corpus"
    if not Path(f"{prefix}_text_document.idx").exists():
        root.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng(seed)
        jsonl = root / "corpus.jsonl"
        with open(jsonl, "w") as f:
            for _ in range(num_docs):
                words = rng.choice(WORDS, size=int(rng.integers(5, 60)))
                f.write(json.dumps({"text": " ".join(words) + "."}) + "\n")
        preprocess_jsonl(
            [str(jsonl)], str(prefix), tokenizer="bytes", append_eod=True, progress=False
        )
    return f"{prefix}_text_document"


def generate_captioning(root: Path, num_samples: int = 96, seed: int = 0) -> str:
    """JPEG+caption WebDataset shards (``energon.demo``) prepared with ``energon prepare``'s code."""
    from energon.cli.demo import DEMO_DATASET_YAML
    from energon.demo import write_captioning_shards
    from energon.prepare.dataset import prepare_dataset

    meta = root / ".nv-meta" / "dataset.yaml"
    if not meta.exists():
        write_captioning_shards(
            root, num_samples=num_samples, num_shards=4, min_size=24, max_size=48, seed=seed
        )
        prepare_dataset(root, split_parts_ratio=[("train", 1.0)], progress=False, num_workers=1)
        meta.write_text(DEMO_DATASET_YAML)
    return str(root)


def make_caption_encoder(seq_length: int):
    """The task encoder class is built lazily so that ``energon`` is imported after the patches."""
    from energon import CaptioningSample, TaskEncoder

    class CaptionTokenEncoder(TaskEncoder):
        """CaptioningSample -> Megatron GPT micro-batch dict (tokens, labels, loss_mask, ...).

        The image becomes IMAGE_GRID**2 pseudo tokens: the picture is averaged to a grey
        IMAGE_GRID x IMAGE_GRID grid and each cell quantised to IMAGE_LEVELS levels (ids after the
        byte vocabulary). The caption is byte-tokenized and followed by EOD; the sequence is padded
        (with EOD) or cut to seq_length + 1. The loss is on caption tokens and the first EOD only.
        This is a stand-in for a vision encoder, enough to train a text model on real image data.
        """

        def __init__(self, seq_length: int) -> None:
            self.seq_length = seq_length

        def encode_sample(self, sample: CaptioningSample) -> dict[str, Any]:
            image = sample.image  # CHW; the default decoder gives float in [0, 1]
            image = image.float() / 255.0 if image.dtype == torch.uint8 else image.float()
            grey = image.mean(dim=0, keepdim=True)[None]
            grid = torch.nn.functional.adaptive_avg_pool2d(grey, IMAGE_GRID).flatten()
            levels = (grid * (IMAGE_LEVELS - 1)).round().clamp(0, IMAGE_LEVELS - 1)
            image_ids = (levels.long() + BYTE_VOCAB).tolist()
            caption_ids = list(sample.caption.encode("utf-8")) + [EOD]
            ids = (image_ids + caption_ids)[: self.seq_length + 1]
            target = torch.zeros(self.seq_length + 1)
            target[len(image_ids) : len(ids)] = 1.0  # predict caption bytes and EOD
            ids = ids + [EOD] * (self.seq_length + 1 - len(ids))
            seq = torch.tensor(ids, dtype=torch.long)
            return {
                "__key__": sample.__key__,
                "tokens": seq[:-1],
                "labels": seq[1:],
                "loss_mask": target[1:],
                "position_ids": torch.arange(self.seq_length, dtype=torch.long),
            }

        def batch(self, samples: list[dict[str, Any]]) -> dict[str, Any]:
            batch = {k: torch.stack([s[k] for s in samples]) for k in samples[0] if k != "__key__"}
            causal = torch.ones(self.seq_length, self.seq_length, dtype=torch.bool).triu(1)
            batch["attention_mask"] = causal.expand(len(samples), 1, -1, -1).contiguous()
            batch["__key__"] = [s["__key__"] for s in samples]
            return batch

    return CaptionTokenEncoder(seq_length)


def build_loader(args, data_path: str, dp_rank: int, dp_size: int):
    from energon import GPTConfig, WorkerConfig, get_savable_loader, get_train_dataset

    wc = WorkerConfig(rank=dp_rank, world_size=dp_size, num_workers=args.workers)
    if args.data == "tokens":
        token_config = GPTConfig(
            sequence_length=args.seq_length,
            random_seed=args.seed,
            split="100, 0, 0",
            tokenizer={"class": "ByteTokenizer"},
            eod_token=EOD,
        )
        dataset = get_train_dataset(
            data_path,
            worker_config=wc,
            batch_size=args.micro_batch_size,
            shuffle_buffer_size=None,
            max_samples_per_sequence=None,
            token_config=token_config,
            # read megatron-core's (already shuffled) sample order as it is
            shuffle_over_epochs_multiplier=None,
            parallel_shard_iters=1,
        )
    else:
        dataset = get_train_dataset(
            data_path,
            worker_config=wc,
            batch_size=args.micro_batch_size,
            shuffle_buffer_size=16,
            max_samples_per_sequence=8,
            task_encoder=make_caption_encoder(args.seq_length),
        )
    return get_savable_loader(dataset)


class RecordingIterator:
    """What Megatron's schedule pulls micro-batches from; remembers what it handed out."""

    def __init__(self, loader) -> None:
        self.loader = loader
        self.iterator = iter(loader)
        self.consumed: list[dict[str, Any]] = []

    def __iter__(self):
        return self

    def __next__(self) -> dict[str, Any]:
        batch = next(self.iterator)
        tokens = batch["tokens"].to(torch.int64).contiguous().numpy()
        self.consumed.append(
            {
                "keys": [str(k) for k in batch.get("__key__", [])],
                "tokens": hashlib.sha256(tokens.tobytes()).hexdigest()[:16],
            }
        )
        return batch


# ---------------------------------------------------------------------------------------------
# Model, step, checkpoint
# ---------------------------------------------------------------------------------------------


def build_model(args, vocab_size: int, device: torch.device):
    from megatron.core.distributed import (
        DistributedDataParallel,
        DistributedDataParallelConfig,
        finalize_model_grads,
    )
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer import TransformerConfig

    config = TransformerConfig(
        num_layers=2,
        hidden_size=args.hidden_size,
        num_attention_heads=4,
        use_cpu_initialization=True,
        pipeline_dtype=torch.float32,
        hidden_dropout=0.0,  # no dropout: a resumed run can then match the losses bit for bit
        attention_dropout=0.0,
    )
    gpt = GPTModel(
        config=config,
        transformer_layer_spec=get_gpt_layer_local_spec(),
        vocab_size=vocab_size,
        max_sequence_length=args.seq_length,
    ).to(device)
    model = DistributedDataParallel(
        config=config,
        ddp_config=DistributedDataParallelConfig(use_distributed_optimizer=False),
        module=gpt,
    )
    config.finalize_model_grads_func = finalize_model_grads  # all-reduces the DP gradients
    return model


def forward_step(device: torch.device, data_iterator, model):
    batch = next(data_iterator)
    tokens = batch["tokens"].to(device)
    labels = batch["labels"].to(device)
    loss_mask = batch["loss_mask"].to(device).float()
    position_ids = batch["position_ids"].to(device)
    mask = batch.get("attention_mask")
    attention_mask = mask.to(device) if mask is not None else None
    output = model(tokens, position_ids, attention_mask, labels=labels)

    def loss_func(output_tensor):
        losses = output_tensor.float().view(-1) * loss_mask.view(-1)
        loss = losses.sum() / loss_mask.sum().clamp(min=1.0)
        return loss, {"lm loss": loss.detach().clone()}  # the schedule divides `loss` in place

    return output, loss_func


def weights_checksum(model) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted(model.module.state_dict().items()):
        if isinstance(tensor, torch.Tensor):
            digest.update(name.encode())
            digest.update(tensor.detach().float().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


def checkpoint_dir(root: str, iteration: int) -> Path:
    return Path(root) / f"iter_{iteration:07d}"


def save_checkpoint(root: str, iteration: int, model, optimizer, iterator, dp_rank: int) -> None:
    from megatron.core import dist_checkpointing

    directory = checkpoint_dir(root, iteration)
    if torch.distributed.get_rank() == 0:
        (directory / "model").mkdir(parents=True, exist_ok=True)
    torch.distributed.barrier()
    model_sd = model.module.sharded_state_dict()
    state = {"model": model_sd, "optimizer": optimizer.sharded_state_dict(model_sd)}
    dist_checkpointing.save(state, str(directory / "model"))
    # Every data-parallel rank saves its loader state (plain data; weights_only-loadable).
    loader_state = iterator.loader.save_state_rank()
    torch.save(
        {"dataloader_state_dict": loader_state, "iteration": iteration},
        directory / f"train_dataloader_dprank{dp_rank:03d}.pt",
    )
    torch.distributed.barrier()
    if torch.distributed.get_rank() == 0:
        (directory / "meta.json").write_text(json.dumps({"iteration": iteration}))
        (Path(root) / "latest_checkpointed_iteration.txt").write_text(f"{iteration}\n")
    torch.distributed.barrier()


def load_checkpoint(root: str, step: int | None, model, optimizer, dp_rank: int) -> tuple[int, Any]:
    """Restore model and optimizer; returns (iteration, this rank's loader state)."""
    from megatron.core import dist_checkpointing

    iteration = step or int((Path(root) / "latest_checkpointed_iteration.txt").read_text())
    directory = checkpoint_dir(root, iteration)
    model_sd = model.module.sharded_state_dict()
    template = {
        "model": model_sd,
        "optimizer": optimizer.sharded_state_dict(model_sd, is_loading=True),
    }
    state = dist_checkpointing.load(template, str(directory / "model"))
    model.module.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    saved = torch.load(directory / f"train_dataloader_dprank{dp_rank:03d}.pt", weights_only=True)
    assert saved["iteration"] == iteration, (saved["iteration"], iteration)
    return iteration, saved["dataloader_state_dict"]


# ---------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", choices=["tokens", "captioning"], default="tokens")
    p.add_argument("--data-path", help="token prefix or prepared dataset (default: generate one)")
    p.add_argument("--data-dir", default="megatron_example_data", help="where generated data goes")
    p.add_argument("--iters", type=int, default=6, help="total iterations (as --train-iters)")
    p.add_argument("--save", help="checkpoint directory to write")
    p.add_argument("--save-interval", type=int, default=0, help="also save every N iterations")
    p.add_argument("--load", help="checkpoint directory to resume from")
    p.add_argument("--ckpt-step", type=int, help="iteration to load (default: the latest saved)")
    p.add_argument("--log-batches", help="JSON lines: per-iteration batches, losses, checksums")
    p.add_argument("--workers", type=int, default=1, help="loader worker processes per rank")
    p.add_argument("--micro-batch-size", type=int, default=2)
    p.add_argument("--num-microbatches", type=int, default=2, help="micro-batches per iteration")
    p.add_argument("--seq-length", type=int, default=64)
    p.add_argument("--hidden-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--seed", type=int, default=1234)
    return p.parse_args(argv)


def init_distributed() -> torch.device:
    if torch.cuda.is_available():
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local_rank)
        device, backend = torch.device("cuda", local_rank), "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    if "RANK" in os.environ:  # started by torchrun
        torch.distributed.init_process_group(backend)
    else:  # a plain `python` run: a one-process group, no TCP port needed
        store = torch.distributed.HashStore()
        torch.distributed.init_process_group(backend, store=store, rank=0, world_size=1)
    return device


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    t_start = time.perf_counter()
    on_cpu = apply_cpu_workarounds()
    device = init_distributed()

    from megatron.core import parallel_state
    from megatron.core.optimizer import get_megatron_optimizer
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    parallel_state.initialize_model_parallel(1, 1)
    rank = torch.distributed.get_rank()
    dp_rank = parallel_state.get_data_parallel_rank()
    dp_size = parallel_state.get_data_parallel_world_size()
    torch.manual_seed(args.seed)
    model_parallel_cuda_manual_seed(args.seed)

    # Data (rank 0 generates it if no path is given; the others wait).
    if args.data_path:
        data_path = args.data_path
    else:
        root = Path(args.data_dir) / args.data
        generate = generate_tokens if args.data == "tokens" else generate_captioning
        if rank == 0:
            generate(root)
        torch.distributed.barrier()
        data_path = generate(root)

    vocab_size = BYTE_VOCAB if args.data == "tokens" else CAPTION_VOCAB
    model = build_model(args, vocab_size, device)
    optimizer = get_megatron_optimizer(optimizer_config(args.lr), [model])

    start = 0
    loader_state = None
    events: list[dict[str, Any]] = []
    if args.load:
        t0 = time.perf_counter()
        start, loader_state = load_checkpoint(args.load, args.ckpt_step, model, optimizer, dp_rank)
        events.append({"event": "loaded", "iteration": start})
        if rank == 0:
            print(f"loaded iteration {start} in {time.perf_counter() - t0:.1f} s", flush=True)

    loader = build_loader(args, data_path, dp_rank, dp_size)
    loader.restore_state_rank(loader_state)  # None (a fresh start) is a no-op
    iterator = RecordingIterator(loader)
    forward_backward = get_forward_backward_func()

    log = open(args.log_batches, "a") if args.log_batches and rank == 0 else None

    def emit(record: dict[str, Any], **per_rank: Any) -> None:
        """Gather one value per rank for each keyword; rank 0 writes the line."""
        gathered = [None] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(gathered, per_rank)
        if log is not None:
            record["ranks"] = gathered
            log.write(json.dumps(record) + "\n")
            log.flush()

    for event in events:
        emit(event, weights=weights_checksum(model))

    for iteration in range(start + 1, args.iters + 1):
        iterator.consumed = []
        model.zero_grad_buffer()
        optimizer.zero_grad()
        losses = forward_backward(
            forward_step_func=partial(forward_step, device),
            data_iterator=iterator,
            model=[model],
            num_microbatches=args.num_microbatches,
            seq_length=args.seq_length,
            micro_batch_size=args.micro_batch_size,
            forward_only=False,
        )
        ok, _grad_norm, _ = optimizer.step()
        assert ok, "optimizer step failed"
        loss = float(torch.stack([x["lm loss"] for x in losses]).mean())
        emit(
            {"event": "train", "iteration": iteration},
            batches=iterator.consumed,
            loss=loss,
            weights=weights_checksum(model),
        )
        if rank == 0:
            print(f"iteration {iteration}/{args.iters} loss {loss:.4f}", flush=True)
        if args.save and (
            iteration == args.iters or (args.save_interval and iteration % args.save_interval == 0)
        ):
            t0 = time.perf_counter()
            save_checkpoint(args.save, iteration, model, optimizer, iterator, dp_rank)
            if rank == 0:
                print(
                    f"saved iteration {iteration} in {time.perf_counter() - t0:.1f} s", flush=True
                )
            emit({"event": "saved", "iteration": iteration}, weights=weights_checksum(model))

    if log is not None:
        log.close()
    if rank == 0:
        mode = "CPU/gloo with workarounds" if on_cpu else f"{device}/nccl"
        print(
            f"done: {args.iters - start} iterations on {mode}, world size "
            f"{torch.distributed.get_world_size()}, {time.perf_counter() - t_start:.1f} s",
            flush=True,
        )
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
