"""Reference-style programs: task encoders with every hook, batching helpers, packing, grouping,
``SkipSample``, error handlers and ``@stateless`` (see programs.py)."""

from tests.compat.programs import program

program("encode_sample_batch_encode_batch")(
    """
import dataclasses, torch
@edataclass
class Encoded(Sample):
    length: int
    text: str
@edataclass
class MyBatch(Batch):
    lengths: torch.Tensor
    texts: list
class TE(TaskEncoder):
    def encode_sample(self, s):
        return Encoded.derive_from(s, length=len(s.text), text=s.text)
    def batch(self, samples):
        return MyBatch.from_samples(samples, lengths=torch.tensor([s.length for s in samples]),
                                    texts=[s.text for s in samples])
    def encode_batch(self, b):
        return {"keys": b.__key__, "lengths": b.lengths.tolist(), "texts": b.texts, "type": type(b).__name__}
ds = get_val_dataset(data["b"], split_part="train", batch_size=8, worker_config=wc(), task_encoder=TE())
return list(get_loader(ds))
"""
)

program("encode_sample_generator_and_skip")(
    """
class TE(DefaultTaskEncoder):
    def encode_sample(self, s):
        n = int(s.__key__[1:])
        if n % 4 == 0:
            raise SkipSample()
        for part in range(n % 3):
            yield TextSample.derive_from(s, text=f"{s.text}#{part}")
ds = get_val_dataset(data["b"], split_part="train", batch_size=4, worker_config=wc(), task_encoder=TE())
return [b.text for b in get_loader(ds)]
"""
)

program("skip_sample_in_batch_and_encode_batch")(
    """
class TE(DefaultTaskEncoder):
    def batch(self, samples):
        if samples[0].__key__ == "b004":
            raise SkipSample()
        return [s.__key__ for s in samples]
    def encode_batch(self, batch):
        if "b012" in batch:
            raise SkipSample()
        return ",".join(batch)
ds = get_val_dataset(data["b"], split_part="train", batch_size=4, worker_config=wc(), task_encoder=TE())
return list(get_loader(ds))
"""
)

program("pre_and_post_encode_sample")(
    """
class TE(DefaultTaskEncoder):
    def preencode_sample(self, s):
        return TextSample.derive_from(s, text="pre:" + s.text)
    def postencode_sample(self, s):
        return TextSample.derive_from(s, text=s.text + ":post")
ds = get_val_dataset(data["b"], split_part="train", batch_size=5, worker_config=wc(), task_encoder=TE())
return [b.text for b in get_loader(ds)]
"""
)

program("packing_with_task_encoder")(
    """
class TE(DefaultTaskEncoder):
    def select_samples_to_pack(self, samples):
        ordered = sorted(samples, key=lambda s: s.__key__)
        return [ordered[i:i + 3] for i in range(0, len(ordered), 3)]
    @stateless
    def pack_selected_samples(self, samples):
        return TextSample(__key__="+".join(s.__key__ for s in samples), __restore_key__=(),
                          text=" ".join(s.text for s in samples))
    def batch(self, samples):
        return [s.__key__ for s in samples]
ds = get_val_dataset(data["b"], split_part="train", batch_size=2, packing_buffer_size=6, worker_config=wc(),
                     task_encoder=TE())
return list(get_loader(ds))
"""
)

program("packing_with_postencode")(
    """
class TE(DefaultTaskEncoder):
    def select_samples_to_pack(self, samples):
        return [samples[:2], samples[2:]]
    def pack_selected_samples(self, samples):
        return TextSample.derive_from(samples[0], text="|".join(s.text for s in samples))
    def postencode_sample(self, s):
        return TextSample.derive_from(s, text=s.text.upper())
    def batch(self, samples):
        return [s.text for s in samples]
ds = get_val_dataset(data["b"], split_part="train", batch_size=1, packing_buffer_size=5, worker_config=wc(),
                     task_encoder=TE())
return list(get_loader(ds))
"""
)

program("batch_group_criterion_val")(
    """
class TE(DefaultTaskEncoder):
    def batch_group_criterion(self, s):
        n = int(s.__key__[1:])
        return ("even" if n % 2 == 0 else "odd"), (3 if n % 2 == 0 else 4)
    def batch(self, samples):
        return [s.__key__ for s in samples]
ds = get_val_dataset(data["b"], split_part="train", batch_size=None, worker_config=wc(), task_encoder=TE())
return list(get_loader(ds))
"""
)

program("batch_group_criterion_fixed_batch_size")(
    """
class TE(DefaultTaskEncoder):
    def batch_group_criterion(self, s):
        return int(s.__key__[1:]) % 3, None
    def batch(self, samples):
        return [s.__key__ for s in samples]
ds = get_val_dataset(data["b"], split_part="train", batch_size=4, worker_config=wc(), task_encoder=TE())
return list(get_loader(ds))
"""
)

program("batch_helpers_on_tensors")(
    """
import torch
a, b = torch.ones(2, 3), torch.zeros(4, 3)
padded = batch_pad_stack([a, b])
stacked = batch_stack([torch.ones(2), torch.zeros(2)])
listed = batch_list([a, b])
generic = generic_batch([{"x": torch.ones(2), "y": "s"}, {"x": torch.zeros(2), "y": "t"}])
cat = concat_pad([torch.ones(2, 3), torch.zeros(1, 2)])
gen_cat = generic_concat([[torch.ones(2)], [torch.zeros(3)]])
return [list(padded.shape), padded[0, 2].tolist(), stacked.tolist(), type(listed).__name__, len(listed),
        list(generic["x"].shape), generic["y"], list(cat.shape), type(gen_cat).__name__]
"""
)

program("homogeneous_concat_mix_of_batches")(
    """
import torch
b1 = TextSample(__key__=["a", "b"], __restore_key__=(), text=["x", "y"])
b2 = TextSample(__key__=["c"], __restore_key__=(), text=["z"])
mixed = homogeneous_concat_mix([b1, b2])
t = homogeneous_concat_mix([torch.ones(2, 2), torch.zeros(1, 2)])
return [type(mixed).__name__, mixed.__key__, mixed.text, list(t.shape)]
"""
)

program("default_task_encoder_type_conversion")(
    """
@edataclass
class Enc(Sample):
    text: str
@edataclass
class RawBatch(Batch):
    text: list
@edataclass
class FinalBatch(Batch):
    text: list
te = DefaultTaskEncoder(encoded_sample_type=Enc, raw_batch_type=RawBatch, batch_type=FinalBatch)
ds = get_val_dataset(data["b"], split_part="train", batch_size=10, worker_config=wc(), task_encoder=te)
return [[type(b).__name__, b.__key__, b.text] for b in get_loader(ds)]
"""
)

program("augment_task_encoder_wraps_another")(
    """
class Inner(DefaultTaskEncoder):
    def encode_sample(self, s):
        return TextSample.derive_from(s, text="inner:" + s.text)
class Outer(AugmentTaskEncoder):
    def encode_sample(self, s):
        s = super().encode_sample(s)
        return TextSample.derive_from(s, text=s.text + ":outer")
ds = get_val_dataset(data["b"], split_part="train", batch_size=6, worker_config=wc(), task_encoder=Outer(Inner()))
return [b.text for b in get_loader(ds)]
"""
)

program("stateless_restore_seeds_reproducible")(
    """
import random
import numpy as np
import torch
class TE(DefaultTaskEncoder):
    @stateless(restore_seeds=True)
    def encode_sample(self, s):
        return TextSample.derive_from(s, text="%s:%d:%d:%d" % (s.__key__, random.randint(0, 10**6),
                                      int(np.random.randint(0, 10**6)), int(torch.randint(0, 10**6, (1,)))))
def run():
    ds = get_val_dataset(data["b"], split_part="train", batch_size=None, worker_config=wc(workers=1),
                         task_encoder=TE())
    return [s.text for s in get_loader(ds)]
random.seed(1)
state = random.getstate()
first, second = run(), run()
return [first == second, len(set(t.split(":")[1] for t in first)) > 20, random.getstate() == state]
"""
)

program("current_indices_in_hooks")(
    """
class TE(DefaultTaskEncoder):
    def encode_sample(self, s):
        return TextSample.derive_from(s, text=str(self.current_sample_index))
    def encode_batch(self, b):
        return {"batch": self.current_batch_index, "samples": b.text}
ds = get_val_dataset(data["b"], split_part="train", batch_size=4, worker_config=wc(), task_encoder=TE())
out = list(get_loader(ds))
flat = [int(x) for b in out for x in b["samples"]]
return [len(flat), len(set(flat)), [b["batch"] for b in out]]
"""
)

program("failure_tolerance_stops_the_loader")(
    """
class TE(DefaultTaskEncoder):
    @stateless(failure_tolerance=3)
    def encode_sample(self, s):
        raise ValueError("broken sample " + s.__key__)
ds = get_val_dataset(data["b"], split_part="train", batch_size=2, worker_config=wc(), task_encoder=TE())
try:
    list(get_loader(ds))
    return "no error"
except Exception as e:
    return [type(e).__name__, isinstance(e, FatalSampleError) if "FatalSampleError" in globals() else None]
"""
)

program("error_handler_skips_and_counts")(
    """
seen = []
def handler(exc, sample, sources=None):
    seen.append(type(exc).__name__)
w = WorkerConfig(rank=0, world_size=1, num_workers=0, global_error_handler=handler)
class TE(DefaultTaskEncoder):
    def encode_sample(self, s):
        if int(s.__key__[1:]) % 5 == 0:
            raise ValueError("bad " + s.__key__)
        return s
ds = get_val_dataset(data["b"], split_part="train", batch_size=5, worker_config=w, task_encoder=TE())
out = [keys(b) for b in get_loader(ds)]
return [out, seen]
"""
)

program("reraise_handler_propagates")(
    """
w = WorkerConfig(rank=0, world_size=1, num_workers=0, global_error_handler=reraise_exception)
class TE(DefaultTaskEncoder):
    def encode_sample(self, s):
        if s.__key__ == "b003":
            raise KeyError("missing field")
        return s
ds = get_val_dataset(data["b"], split_part="train", batch_size=2, worker_config=w, task_encoder=TE())
try:
    list(get_loader(ds))
    return "no error"
except Exception as e:
    return [type(e).__name__, "missing field" in str(e)]
"""
)

program("system_errors_are_never_skipped")(
    """
class TE(DefaultTaskEncoder):
    def encode_sample(self, s):
        return undefined_name  # noqa: F821 - a programming error
ds = get_val_dataset(data["b"], split_part="train", batch_size=2, worker_config=wc(), task_encoder=TE())
try:
    list(get_loader(ds))
    return "no error"
except Exception as e:
    return type(e).__name__
"""
)

program("build_val_datasets_override")(
    """
class TE(DefaultTaskEncoder):
    def build_val_datasets(self, *, datasets, worker_config, batch_size, batch_drop_last=False,
                           packing_buffer_size=None, limit=None):
        parts = [self._load_dataset(d, 0, worker_config) for d in datasets]
        ds = ConcatDataset(*parts, worker_config=worker_config) if len(parts) > 1 else parts[0]
        ds = FilterDataset(ds, filter_fn=lambda s: s.__key__.endswith("1"), worker_config=worker_config)
        return self.build_batch(ds, batch_size=batch_size, worker_config=worker_config)
ds = get_val_dataset(data["mds_val"], split_part="val", batch_size=3, worker_config=wc(), task_encoder=TE())
return [[keys(b), [sf["part"] for sf in b.__subflavors__]] for b in get_loader(ds)]
"""
)

program("build_encode_sample_override_calls_super")(
    """
calls = []
class TE(DefaultTaskEncoder):
    def encode_sample(self, s):
        return TextSample.derive_from(s, text=s.text[::-1])
    def build_encode_sample(self, dataset, *, worker_config):
        calls.append(type(dataset).__name__)
        ds = super().build_encode_sample(dataset, worker_config=worker_config)
        return MapDataset(ds, lambda s: TextSample.derive_from(s, text=s.text + "!"), worker_config=worker_config)
ds = get_val_dataset(data["b"], split_part="train", batch_size=10, worker_config=wc(), task_encoder=TE())
return [len(calls), [b.text for b in get_loader(ds)]]
"""
)

program("build_batch_override_in_training")(
    """
class TE(DefaultTaskEncoder):
    def build_batch(self, dataset, *, batch_size, batch_drop_last=False, packing_buffer_size=None, worker_config):
        return BatchDataset(dataset, batch_size, lambda xs: sorted(x.__key__ for x in xs), worker_config=worker_config)
ds = get_train_dataset(data["b"], batch_size=5, shuffle_buffer_size=None, max_samples_per_sequence=None,
                       worker_config=wc(), task_encoder=TE())
it = iter(get_savable_loader(ds))
batches = [next(it) for _ in range(12)]
return [len(b) for b in batches], sorted(collections.Counter(k for b in batches for k in b).values())
"""
)

program("task_encoder_cache_property_outside_loader")(
    """
te = DefaultTaskEncoder()
try:
    te.cache
    return "no error"
except Exception as e:
    return "error"
"""
)
