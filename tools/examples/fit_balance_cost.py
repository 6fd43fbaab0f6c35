"""Fit the balance cost to a real model's measured step times, instead of guessing it.

    python tools/examples/fit_balance_cost.py --measure 48

1. Draws encoded samples of ``energon.demo.vlm`` (real JPEGs, texts, MP4 clips) through the
   loader, and times forward + backward passes of ``tiny_vlm.TinyVlm`` (CPU time of this thread,
   the best of ``--repeats``) on batches of 1 to 8 of them, recording each sample's text and media
   token counts.
2. ``energon.balance.fit_cost`` fits ``seconds = overhead + a x text + b x media + q x sum(n^2)``.
3. Checks the fit on batches it did not see, against the default ``MultimodalCost`` (scaled to
   the same mean), and prints how to use it: ``Balance(max_length, cost=fit.cost_function())``.

With your own model: time your training step (or forward pass) on batches of varied samples,
record ``(text tokens, media tokens)`` per sample as your encoder makes them, and call
``fit_cost(batches, seconds)``; see docs/task-encoders.md, "A cost model from measurements".
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile

import torch
from tiny_vlm import TinyVlm, measure_steps, sample_input, timed_step

from energon import WorkerConfig, get_loader, get_train_dataset
from energon.balance import Balance, MultimodalCost, fit_cost
from energon.demo.vlm import VlmTaskEncoder, write_vlm_shards
from energon.format.layout import DATASET_YAML_FILENAME, nv_meta_dir


def encoded_samples(root: str, count: int) -> list:
    path = os.path.join(root, "vlm-fit")
    if not (nv_meta_dir(path) / DATASET_YAML_FILENAME).exists():
        write_vlm_shards(path, num_samples=max(200, count), num_shards=2, seed=11)
    dataset = get_train_dataset(
        path,
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0),
        batch_size=None,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
        task_encoder=VlmTaskEncoder(),
    )
    it = iter(get_loader(dataset))
    return [next(it) for _ in range(count)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default=os.path.join(tempfile.gettempdir(), "energon-vlm-fit"))
    parser.add_argument("--measure", type=int, default=48, help="batches timed to fit")
    parser.add_argument("--check", type=int, default=16, help="batches timed to check the fit")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--max-length", type=int, default=4096)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    rng = random.Random(0)
    samples = encoded_samples(args.root, 160)
    model = TinyVlm(args.dim, args.layers)
    timed_step(model, [sample_input(samples[0], args.max_length)], 1)  # warm up
    print(f"timing {args.measure + args.check} batches (load average {os.getloadavg()[0]:.1f}) ...")
    fit = fit_cost(*measure_steps(model, samples, args.measure, rng, args.max_length, args.repeats))
    print(fit)
    check_counts, check_seconds = measure_steps(
        model, samples, args.check, rng, args.max_length, args.repeats
    )
    compare(fit, check_counts, check_seconds)
    cost = fit.cost_function(MultimodalCost())
    print(f"use it: Balance(max_length={args.max_length}, cost={cost!r})")
    Balance(args.max_length, cost=cost)  # a valid balance configuration


def compare(fit, counts, seconds) -> None:
    """Median relative error on unseen batches: the fit, and the default MultimodalCost scaled
    to the measured mean (only ratios of costs matter to balancing)."""
    default = MultimodalCost()
    fitted = [fit.predict(batch) for batch in counts]
    guessed = [sum(default.cost_of_tokens(t + m) for t, m in batch) for batch in counts]
    scale = statistics.mean(seconds) / statistics.mean(guessed)
    for name, predicted in (("fitted", fitted), ("MultimodalCost()", [g * scale for g in guessed])):
        errors = [abs(p - s) / s for p, s in zip(predicted, seconds)]
        print(
            f"{name:>18}: median error {statistics.median(errors):.1%}, worst "
            f"{max(errors):.1%} on {len(seconds)} unseen batches"
        )


if __name__ == "__main__":
    main()
