"""Train a small VLM on R real gloo ranks, today's per-rank batches against balanced ones.

    python tools/examples/train_balanced_vlm.py --ranks 4 --steps 24

Data: ``energon.demo.vlm`` (real JPEGs of six sizes, log-normal texts, some MP4 clips; 0-8
images per sample), prepared with media metadata. Model: ``tiny_vlm.TinyVlm`` (image patches
and text tokens, attention within each sample). Every rank runs each configuration on the same
global steps, one window of ``--window`` steps of each in turn (the order rotating by window),
with the same initial weights and plain data-parallel training: forward and backward on the rank's samples, one
``all_reduce`` of the flattened gradients, an SGD step.

- *per-rank* (today): each rank takes its own micro-batch of ``--batch`` samples (positions
  ``r, r + R, ...`` of the plan), as ``SequencePacker`` packing per rank does;
- *balanced*: ``get_train_dataset(balance=Balance(max_length, window=W))``: each window's samples
  composed into steps of near-equal cost per rank (``MultimodalCost`` from the index);
- *balanced, fitted cost* (``--fit-steps N``, default 32): the same with a cost fitted to this
  model's measured forward + backward times (``energon.fit_cost``; rank 0 times ``N`` batches
  before training).

All see exactly the same samples per window (checked). Loading is not timed: each step's batch
is drawn first, then all ranks meet at a barrier and the step is timed from there. Per rank and
step: wall time of forward + backward (``compute``), wall time of the ``all_reduce`` (``wait``:
the all-reduce itself plus waiting for the slowest rank), and CPU time of forward + backward
(``time.thread_time``). Reported per configuration: mean step time, tokens per second and the
share of step time the ranks spend in the all-reduce; and the same from CPU times (the step as
if each rank had a core of its own: its slowest rank's compute CPU time; a rank waits for the
difference), which is what counts when ranks share fewer cores than they are, as here.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from itertools import islice

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from tiny_vlm import TinyVlm, measure_steps, sample_input

from energon import WorkerConfig, get_savable_loader, get_train_dataset
from energon.balance import Balance, FittedCost, fit_cost
from energon.demo.vlm import VlmTaskEncoder, write_vlm_shards
from energon.format.layout import DATASET_YAML_FILENAME, nv_meta_dir


class ListBatches(VlmTaskEncoder):
    """Today's micro-batches as lists of encoded samples (the model packs nothing itself)."""

    def batch(self, samples: list) -> list:
        return samples


def dataset(root: str, samples: int) -> str:
    path = os.path.join(root, f"vlm-train-{samples}")
    if not (nv_meta_dir(path) / DATASET_YAML_FILENAME).exists():
        print(f"writing {samples} VLM samples to {path} ...", flush=True)
        write_vlm_shards(path, num_samples=samples, num_shards=max(1, samples // 200), seed=7)
    return path


def loader(path: str, rank: int, args, balance: Balance | None):
    return iter(
        get_savable_loader(
            get_train_dataset(
                path,
                worker_config=WorkerConfig(rank=rank, world_size=args.ranks, num_workers=0),
                batch_size=args.batch,
                shuffle_buffer_size=64,
                max_samples_per_sequence=32,
                task_encoder=VlmTaskEncoder() if balance else ListBatches(),
                balance=balance,
            )
        )
    )


def fitted_cost(path: str, rank: int, args, state: dict) -> FittedCost:
    """Rank 0 times forward + backward of the model on batches of the data (its CPU time) and
    fits the cost (``energon.fit_cost``); every rank gets the same fit."""
    fit = [None]
    if rank == 0:
        model = TinyVlm(args.dim, args.layers, args.heads)
        model.load_state_dict(state)
        samples = [
            s
            for batch in islice(
                loader(path, 0, argparse.Namespace(**{**vars(args), "ranks": 1}), None), 12
            )
            for s in batch
        ]
        counts, seconds = measure_steps(
            model, samples, args.fit_steps, random.Random(0), args.max_length, 2
        )
        fit[0] = fit_cost(counts, seconds)
        print(f"fitted on {args.fit_steps} steps: {fit[0]}", flush=True)
    dist.broadcast_object_list(fit, src=0)
    return fit[0].cost_function()


class Trainer:
    """One configuration's model, optimizer and per-step records on one rank."""

    def __init__(self, args, state: dict) -> None:
        self.model = TinyVlm(args.dim, args.layers, args.heads)
        self.model.load_state_dict(state)
        self.params = [p for p in self.model.parameters()]
        self.optimizer = torch.optim.SGD(self.params, lr=1e-3)
        self.records: list[dict] = []

    def step(self, inputs) -> None:
        dist.barrier()  # every rank has its batch: time the step, not the loading
        start, cpu = time.perf_counter(), time.thread_time()
        loss = self.model(inputs)
        loss.backward()
        computed, cpu = time.perf_counter(), time.thread_time() - cpu
        grads = torch.cat([p.grad.reshape(-1) for p in self.params])
        dist.all_reduce(grads)
        reduced = time.perf_counter()
        offset = 0
        for p in self.params:
            p.grad.copy_(grads[offset : offset + p.numel()].view_as(p) / dist.get_world_size())
            offset += p.numel()
        self.optimizer.step()
        self.optimizer.zero_grad()
        end = time.perf_counter()
        self.records.append(
            {
                "step": end - start,
                "compute": computed - start,
                "wait": reduced - computed,
                "cpu": cpu,
                "tokens": sum(s.length for s in inputs),
                "loss": float(loss.detach()),
            }
        )


def rank_main(rank: int, args, path: str, store: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=args.ranks, init_method=f"file://{store}")
    torch.manual_seed(0)  # the same initial weights on every rank and in every configuration
    state = TinyVlm(args.dim, args.layers, args.heads).state_dict()
    balances = {"per-rank": None, "balanced": Balance(args.max_length, window=args.window)}
    if args.fit_steps:
        cost = fitted_cost(path, rank, args, state)
        balances["balanced, fitted cost"] = Balance(args.max_length, cost=cost, window=args.window)
    names = list(balances)
    trainers = {name: Trainer(args, state) for name in names}
    loaders = {name: loader(path, rank, args, balance) for name, balance in balances.items()}
    keys: dict[str, list] = {name: [] for name in names}
    for window in range(args.steps // args.window):
        for name in names[window % len(names) :] + names[: window % len(names)]:
            for _ in range(args.window):
                batch = next(loaders[name])
                members = batch if balances[name] is None else batch.samples
                keys[name].append(sorted(s.__key__ for s in members))
                trainers[name].step([sample_input(s, args.max_length) for s in members])
    gathered = [None] * args.ranks
    mine = {"records": {n: t.records for n, t in trainers.items()}, "keys": keys}
    dist.all_gather_object(gathered, mine)
    if rank == 0:
        with open(out, "w") as f:
            json.dump(gathered, f)
    dist.barrier()
    dist.destroy_process_group()


def summarize(ranks: list[dict], args) -> dict:
    """Per configuration: the measured and the per-core (CPU time) step figures."""
    names = list(ranks[0]["records"])
    for w in range(args.steps // args.window):  # the same samples per window in each
        span = slice(w * args.window, (w + 1) * args.window)
        seen = [
            sorted(k for r in ranks for step in r["keys"][n][span] for k in step) for n in names
        ]
        assert all(s == seen[0] for s in seen), f"window {w}: different samples"
    out = {}
    for name in names:
        steps = list(zip(*(r["records"][name] for r in ranks)))  # [step][rank]
        wall = [statistics.mean(rec["step"] for rec in step) for step in steps]
        tokens = [sum(rec["tokens"] for rec in step) for step in steps]
        wait = [statistics.mean(rec["wait"] / rec["step"] for rec in step) for step in steps]
        per_core = [max(rec["cpu"] for rec in step) for step in steps]
        idle = [
            statistics.mean((max(r["cpu"] for r in step) - rec["cpu"]) for rec in step) / pc
            for step, pc in zip(steps, per_core)
        ]
        straggle = [
            max(r["cpu"] for r in step) / statistics.mean(r["cpu"] for r in step) for step in steps
        ]
        out[name] = {
            "step_s": statistics.mean(wall),
            "tokens_per_s": sum(tokens) / sum(wall),
            "wait_share": statistics.mean(wait),
            "core_step_s": statistics.mean(per_core),
            "core_tokens_per_s": sum(tokens) / sum(per_core),
            "core_wait_share": statistics.mean(idle),
            "cpu_straggler_median": statistics.median(straggle),
            "cpu_straggler_worst": max(straggle),
            "tokens_per_step": statistics.mean(tokens),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default=os.path.join(tempfile.gettempdir(), "energon-vlm-train"))
    parser.add_argument("--samples", type=int, default=1200)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--batch", type=int, default=4, help="samples per rank and step")
    parser.add_argument("--steps", type=int, default=24, help="steps of each configuration")
    parser.add_argument("--window", type=int, default=4, help="Balance.window (global steps)")
    parser.add_argument("--max-length", type=int, default=4096)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument(
        "--fit-steps", type=int, default=32, help="steps timed to fit a cost (0: no fitted run)"
    )
    args = parser.parse_args()
    if args.steps % args.window:
        parser.error("--steps must be a multiple of --window")
    path = dataset(args.root, args.samples)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        out, store = os.path.join(tmp, "result.json"), os.path.join(tmp, "store")
        started = time.perf_counter()
        mp.start_processes(
            rank_main, args=(args, path, store, out), nprocs=args.ranks, start_method="fork"
        )
        elapsed = time.perf_counter() - started
        with open(out) as f:
            ranks = json.load(f)
    report(summarize(ranks, args), args, load_before, elapsed)


def report(result: dict, args, load_before, elapsed: float) -> None:
    print(
        f"{args.ranks} gloo ranks on {os.cpu_count()} cores, {args.batch} samples per rank and "
        f"step, {args.steps} steps of each configuration (windows of {args.window} in turn), "
        f"max length {args.max_length}, TinyVlm dim {args.dim} x {args.layers} layers; "
        f"load average before {load_before[0]:.1f}, after {os.getloadavg()[0]:.1f}; "
        f"{elapsed:.0f} s"
    )
    rows = [
        ("mean step time, s (measured)", "step_s", "{:.3f}"),
        ("tokens / s (measured)", "tokens_per_s", "{:,.0f}"),
        ("share of step time in the all-reduce (measured)", "wait_share", "{:.1%}"),
        ("mean step time, s (per core: slowest rank's compute CPU time)", "core_step_s", "{:.3f}"),
        ("tokens / s (per core)", "core_tokens_per_s", "{:,.0f}"),
        ("share of step time ranks wait (per core)", "core_wait_share", "{:.1%}"),
        ("straggler ratio of compute CPU time, median", "cpu_straggler_median", "{:.3f}"),
        ("straggler ratio of compute CPU time, worst", "cpu_straggler_worst", "{:.3f}"),
    ]
    names = list(result)
    header = ["", "per-rank batches (today)"] + [f"{n} (gain)" for n in names[1:]]
    print("| " + " | ".join(header) + " |")
    print("| --- |" + " --: |" * (len(header) - 1))
    for label, key, fmt in rows:
        base = result[names[0]][key]
        cells = [fmt.format(base)]
        for name in names[1:]:
            value = result[name][key]
            gain = ""
            if key.endswith("step_s"):
                gain = f" ({base / value:.2f}x)"
            elif "tokens" in key:
                gain = f" ({value / base:.2f}x)"
            cells.append(fmt.format(value) + gain)
        print(f"| {label} | " + " | ".join(cells) + " |")
    print(json.dumps(result))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
