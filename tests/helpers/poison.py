"""Task encoders that end their loader worker on chosen sample keys (the lost-worker tests).

In a loader worker the poison key ends the process (``how``: ``"sigkill"``, ``"segfault"`` (a real
invalid read), ``"exit"`` (``os._exit(3)``) or ``"sleep"`` (stuck for 600 s)); in the main process
(a reference run without workers, or a restored run) the sample is skipped (``SkipSample``: what
the loop would have seen without it), or fails the run (``main="raise"``: it must not be read
again)."""

from __future__ import annotations

import ctypes
import dataclasses
import os
import signal
import time

import torch
import torch.utils.data

from energon import DefaultTaskEncoder, Sample, SkipSample
from energon.demo.vlm import VlmTaskEncoder
from energon.errors import FatalSampleError
from energon.task_encoder.packing import PackingTaskEncoder


def end_process(how: str) -> None:
    if how == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif how == "segfault":
        ctypes.string_at(0)
    elif how == "exit":
        os._exit(3)
    elif how == "sleep":
        time.sleep(600)


@dataclasses.dataclass
class TokenSample(Sample):
    tokens: torch.Tensor


class PoisonCheck:
    """The poison keys and what they do (see the module docstring)."""

    def set_poison(self, poison=(), how="sigkill", main="skip") -> None:
        self.poison, self.how, self.main = tuple(poison), how, main

    def check(self, key: str) -> None:
        if key not in self.poison:
            return
        if torch.utils.data.get_worker_info() is not None:
            end_process(self.how)
        if self.main == "raise":
            raise FatalSampleError(f"sample {key} was read again")
        raise SkipSample()


class Poison(PoisonCheck, DefaultTaskEncoder):
    def __init__(self, poison=(), how="sigkill", main="skip"):
        super().__init__()
        self.set_poison(poison, how, main)

    def encode_sample(self, sample):
        self.check(sample.__key__)
        return sample


class PoisonGroups(Poison):
    """Short and long texts in separate batches of different sizes."""

    def batch_group_criterion(self, sample):
        return ("long", 3) if len(sample.text) > 30 else ("short", 2)


class PoisonPacker(PoisonCheck, PackingTaskEncoder):
    """Texts as byte tokens, packed into sequences of at most 96."""

    def __init__(self, poison=(), how="sigkill", main="skip"):
        super().__init__(96, over_length="split")
        self.set_poison(poison, how, main)

    def encode_sample(self, sample):
        self.check(sample.__key__)
        tokens = torch.frombuffer(bytearray(sample.text.encode()), dtype=torch.uint8)
        return TokenSample(
            __key__=sample.__key__,
            __restore_key__=(),
            __subflavors__=sample.__subflavors__,
            tokens=tokens.to(torch.int64),
        )


class PoisonVlm(PoisonCheck, VlmTaskEncoder):
    def __init__(self, poison=(), how="sigkill", main="skip"):
        super().__init__()
        self.set_poison(poison, how, main)

    def encode_sample(self, sample):
        self.check(sample.__key__)
        return sample
