"""Change the data mix during training: an annealing schedule, and reweighting from per-domain losses.

Runs on CPU in seconds, on one process or several (``torchrun``, gloo); it makes its own small
corpus (three "domains" of text of different difficulty) under ``--data-dir``::

    # annealing: the mix is part of the config (weights as schedules over training steps)
    python tools/examples/blend_schedules.py anneal --steps 300

    # loss-based reweighting (DoReMi-style): every --every steps, the domains whose loss is
    # highest get more weight; the change starts at the next step, on every rank and worker
    python tools/examples/blend_schedules.py reweight --steps 300 --log-steps run.jsonl
    python tools/examples/blend_schedules.py reweight --steps 150 --save ckpt.pt
    python tools/examples/blend_schedules.py reweight --steps 300 --load ckpt.pt --log-steps resumed.jsonl
    # resumed.jsonl repeats run.jsonl's lines from step 150 on: batches, losses, weights
    torchrun --standalone --nproc_per_node=2 tools/examples/blend_schedules.py reweight --sync broadcast

The model is a byte bigram (an embedding and a linear layer); each step trains on one micro-batch
per rank. ``--sync allreduce`` (default) all-reduces the per-domain losses, so every rank computes
the same weights and calls ``loader.set_blend_weights(weights)``; ``--sync broadcast`` lets rank 0
decide alone and sends its weights with ``loader.set_blend_weights(weights, broadcast=True)``.
The checkpoint holds the model, the optimizer, the reweighting's running losses and every rank's
loader state (plain data; it records each weight change, so the resumed run changes the mix at
the same steps).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import sys
import tarfile
from io import BytesIO
from pathlib import Path

import torch
import torch.distributed as dist

# Runs from a source checkout without installing energon.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from energon import WorkerConfig, get_savable_loader, get_train_dataset  # noqa: E402
from energon.prepare.dataset import prepare_dataset  # noqa: E402

DOMAINS = ("repetitive", "digits", "letters")  # from easy to hard to predict
TEXT_YAML = (
    "sample_type:\n  __module__: energon\n  __class__: TextSample\nfield_map:\n  text: txt\n"
)
SEQ = 48

ANNEAL_YAML = """\
__class__: MetadatasetV2
global_batch_size: {gbs}          # converts the step-based schedules to samples
splits:
  train:
    blend:
      - path: ./repetitive        # plenty of it early on, little at the end
        weight: {{cosine: {{start: 0, end: {end}, from: 3.0, to: 0.5}}, unit: steps}}
        subflavors: {{domain: repetitive}}
      - path: ./digits
        weight: 1
        subflavors: {{domain: digits}}
      - path: ./letters           # the "high-quality" data we anneal to
        weight: {{linear: {{start: {anneal}, end: {end}, from: 0.5, to: 4.0}}, unit: steps}}
        subflavors: {{domain: letters}}
"""

FLAT_YAML = """\
__class__: MetadatasetV2
splits:
  train:
    blend:
{entries}
"""


def make_corpus(data_dir: Path) -> None:
    """Three prepared datasets of 400 texts each (two shards), if not there yet."""
    rng = random.Random(0)
    makers = {
        "repetitive": lambda: "abc" * rng.randint(5, 20),
        "digits": lambda: "".join(rng.choice("0123456789") for _ in range(rng.randint(20, 60))),
        "letters": lambda: "".join(
            rng.choice("abcdefghijklmnopqrstuvwxyz ") for _ in range(rng.randint(20, 60))
        ),
    }
    for domain, make in makers.items():
        root = data_dir / domain
        if (root / ".nv-meta" / ".info.json").exists():
            continue
        (root / "parts").mkdir(parents=True, exist_ok=True)
        for shard in range(2):
            with tarfile.open(root / "parts" / f"data-{shard:05d}.tar", "w") as tar:
                for i in range(200):
                    payload = make().encode()
                    info = tarfile.TarInfo(f"{domain}_{shard}_{i:04d}.txt")
                    info.size = len(payload)
                    tar.addfile(info, BytesIO(payload))
        prepare_dataset(root, split_parts_ratio=[("train", 1.0)], progress=False, num_workers=1)
        (root / ".nv-meta" / "dataset.yaml").write_text(TEXT_YAML)


def write_config(args: argparse.Namespace, data_dir: Path, world: int) -> Path:
    path = data_dir / f"{args.recipe}.yaml"
    if args.recipe == "anneal":
        text = ANNEAL_YAML.format(
            gbs=args.batch_size * world, anneal=int(args.steps * 0.6), end=args.steps
        )
    else:
        entries = "".join(
            f"      - {{path: ./{d}, weight: 1, subflavors: {{domain: {d}}}}}\n" for d in DOMAINS
        )
        text = FLAT_YAML.format(entries=entries)
    path.write_text(text)
    return path


class Bigram(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(256, 32)
        self.out = torch.nn.Linear(32, 256)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.out(self.embed(tokens))


def encode(texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Byte ids, padded to SEQ + 1, and a mask of the real next-byte targets."""
    ids = torch.zeros(len(texts), SEQ + 1, dtype=torch.long)
    mask = torch.zeros(len(texts), SEQ)
    for i, text in enumerate(texts):
        data = list(text.encode()[: SEQ + 1])
        ids[i, : len(data)] = torch.tensor(data)
        mask[i, : len(data) - 1] = 1
    return ids, mask


def per_sample_loss(model: Bigram, texts: list[str]) -> torch.Tensor:
    ids, mask = encode(texts)
    logits = model(ids[:, :-1])
    loss = torch.nn.functional.cross_entropy(
        logits.reshape(-1, 256), ids[:, 1:].reshape(-1), reduction="none"
    ).view(len(texts), SEQ)
    return (loss * mask).sum(1) / mask.sum(1).clamp(min=1)


class Reweighter:
    """DoReMi-style: weight_d proportional to exp(eta * running loss_d), mixed with uniform."""

    def __init__(self, eta: float = 2.0, smoothing: float = 0.1, momentum: float = 0.8) -> None:
        self.eta, self.smoothing, self.momentum = eta, smoothing, momentum
        self.running = [0.0] * len(DOMAINS)
        self.seen = [False] * len(DOMAINS)

    def update(self, sums: list[float], counts: list[float]) -> None:
        for d, (s, c) in enumerate(zip(sums, counts)):
            if c:
                mean = s / c
                m = self.momentum if self.seen[d] else 0.0
                self.running[d] = m * self.running[d] + (1 - m) * mean
                self.seen[d] = True

    def weights(self) -> list[float]:
        scores = [math.exp(self.eta * loss) for loss in self.running]
        total = sum(scores)
        n = len(scores)
        return [round((1 - self.smoothing) * s / total + self.smoothing / n, 6) for s in scores]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("recipe", choices=("anneal", "reweight"))
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=8, help="micro-batch per rank")
    parser.add_argument("--every", type=int, default=25, help="reweight every N steps")
    parser.add_argument("--sync", choices=("allreduce", "broadcast"), default="allreduce")
    parser.add_argument("--num-workers", type=int, default=1)
    parser.add_argument("--data-dir", default="blend_example_data")
    parser.add_argument("--save", help="write a checkpoint after the last step")
    parser.add_argument("--load", help="resume from a checkpoint")
    parser.add_argument("--log-steps", help="JSON lines: one per step (rank 0)")
    args = parser.parse_args()

    distributed = "WORLD_SIZE" in os.environ
    if distributed:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if distributed else 0
    world = dist.get_world_size() if distributed else 1
    torch.manual_seed(0)  # the example's model init; energon itself never touches global RNGs
    torch.set_num_threads(1)

    data_dir = Path(args.data_dir).absolute()
    if rank == 0:
        make_corpus(data_dir)
        config = write_config(args, data_dir, world)
    if distributed:
        dist.barrier()
    config = data_dir / f"{args.recipe}.yaml"

    wc = WorkerConfig(rank=rank, world_size=world, num_workers=args.num_workers)
    dataset = get_train_dataset(
        config,
        worker_config=wc,
        batch_size=args.batch_size,
        shuffle_buffer_size=32,
        max_samples_per_sequence=50,
        num_streams=4,
        global_batch_size=args.batch_size * world,
    )
    loader = get_savable_loader(dataset)
    loader.blend_window = 200  # blend_report() windows: 200 samples of the global clock
    model = Bigram()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.02)
    reweighter = Reweighter()
    start = 0
    if args.load:
        checkpoint = torch.load(args.load, weights_only=True)
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        reweighter.running = checkpoint["running"]
        reweighter.seen = checkpoint["seen"]
        start = checkpoint["step"]
        loader.restore_state_global(checkpoint["loader"] if rank == 0 else None, src_rank=0)

    log = open(args.log_steps, "a" if args.load else "w") if args.log_steps and rank == 0 else None
    sums, counts = [0.0] * len(DOMAINS), [0.0] * len(DOMAINS)
    batches = iter(loader)
    for step in range(start, args.steps):
        batch = next(batches)
        domains = [DOMAINS.index(sf["domain"]) for sf in batch.__subflavors__]
        losses = per_sample_loss(model, batch.text)
        optimizer.zero_grad()
        loss = losses.mean()
        loss.backward()
        if distributed:
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad /= world
        optimizer.step()
        for d, value in zip(domains, losses.tolist()):
            sums[d] += value
            counts[d] += 1
        changed = None
        if args.recipe == "reweight" and (step + 1) % args.every == 0:
            if args.sync == "allreduce" and distributed:
                totals = torch.tensor(sums + counts, dtype=torch.float64)
                dist.all_reduce(totals)
                sums, counts = totals[: len(DOMAINS)].tolist(), totals[len(DOMAINS) :].tolist()
            reweighter.update(sums, counts)
            sums, counts = [0.0] * len(DOMAINS), [0.0] * len(DOMAINS)
            changed = reweighter.weights()
            # from the next step on, on every rank and worker; recorded in the loader state
            loader.set_blend_weights(changed, broadcast=args.sync == "broadcast")
        if log is not None:
            digest = hashlib.sha256(json.dumps(list(batch.__key__)).encode()).hexdigest()[:12]
            counts_now = [domains.count(d) for d in range(len(DOMAINS))]
            record = {"step": step, "keys": digest, "domains": counts_now, "loss": loss.item()}
            if changed is not None:
                record["weights"] = changed
            log.write(json.dumps(record) + "\n")
    states = loader.save_state_global(global_dst_rank=0)
    if rank == 0:
        report = loader.blend_report()
        print(report.table(max_rows=12))
        for source in report:
            print(
                f"{source['name']}: requested {source['requested']:.3f}, "
                f"observed {source['observed']:.3f}"
            )
        if args.save:
            torch.save(
                {
                    "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "running": reweighter.running,
                    "seen": reweighter.seen,
                    "step": args.steps,
                    "loader": states,
                },
                args.save,
            )
    if log is not None:
        log.close()
    if distributed:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
