"""Reference-style programs for hand-written datasets and the per-dataset state protocol: a
``SavableDataset(worker_config)`` subclass with its own ``__iter__`` and ``_savable_fields``, a
hand-written ``BaseWrapperDataset`` over it and over a dataset from ``get_val_dataset``, run by
hand (``save_state`` / ``restore_state`` / ``reset_state_deep``) and by the loaders (saved and
restored with 0 and 2 workers). See programs.py."""

from tests.compat.programs import program

HAND_WRITTEN = """
from megatron.energon.wrappers.base import BaseWrapperDataset

class Counter(SavableDataset):
    _savable_fields = ("_i",)

    def __init__(self, n, worker_config):
        super().__init__(worker_config)
        self.n = n
        self.reset_state_own()

    def reset_state_own(self):
        self._i = 0

    def __len__(self):
        return self.n

    def len_worker(self, worker_idx=None):
        return self.n

    def worker_has_samples(self):
        return True

    def __iter__(self):
        worker = self.worker_config.rank_worker_id()
        while self._i < self.n:
            i = self._i
            self._i += 1
            yield f"w{worker}-{i}"

    def config(self):
        return {"type": "Counter", "n": self.n}

class Tag(BaseWrapperDataset):
    _savable_fields = ("_seen",)

    def __init__(self, dataset, *, worker_config):
        super().__init__(dataset, worker_config=worker_config)
        self.reset_state_own()

    def reset_state_own(self):
        self._seen = 0

    def __len__(self):
        return len(self.dataset)

    def len_worker(self, worker_idx=None):
        return self.dataset.len_worker(worker_idx)

    def __iter__(self):
        for x in self.dataset:
            self._seen += 1
            yield (keys(x) if hasattr(x, "__key__") else x, self._seen)

    def config(self):
        return {"type": "Tag", "dataset": self.dataset.config()}

def run_and_resume(make, steps, workers):
    loader = get_savable_loader(make(wc(workers=workers)))
    it = iter(loader)
    first = [next(it) for _ in range(steps)]
    state = loader.save_state_rank()
    again = get_savable_loader(make(wc(workers=workers)))
    again.restore_state_rank(state)
    return {"first": first, "rest": list(again)}
"""

program("hand_written_dataset_by_hand")(
    HAND_WRITTEN
    + """
ds = Counter(5, wc())
it = iter(ds)
head = [next(it), next(it)]
state = ds.save_state()
other = Counter(5, wc())
other.restore_state(state)
rest = list(other)
ds.reset_state_deep()
errors = []
try:
    other.restore_state({"__class__": "Tag", "_i": 1})
except Exception as e:
    errors.append("refused")
w = Tag(Counter(4, wc()), worker_config=wc())
it = iter(w)
w_head = [next(it), next(it)]
w_state = w.save_state()
w2 = Tag(Counter(4, wc()), worker_config=wc())
w2.restore_state(w_state)
w_rest = list(w2)
w2.reset_state_deep()
return {
    "head": head, "state": [type(state).__name__, dict(state)], "rest": rest, "reset": ds._i,
    "errors": errors, "isinstance": [isinstance(ds, SavableDataset), isinstance(w, SavableDataset)],
    "w": [w_head, json.loads(json.dumps(w_state)), w_rest, w2._seen, w2.dataset._i],
    "sizes": [len(ds), Counter(5, wc(workers=2)).len_rank(), len(w), w.worker_has_samples()],
    "config": w.config(), "can_restore": [ds.can_restore_sample(), w.can_restore_sample()],
}
"""
)

program("hand_written_dataset_in_loaders")(
    HAND_WRITTEN
    + """
make = lambda config: Tag(Counter(4, config), worker_config=config)
out = {f"workers{n}": run_and_resume(make, 3, n) for n in (0, 2)}
out["plain"] = [x for x in get_loader(Counter(3, wc(workers=2)))]
return out
"""
)

program("hand_written_wrapper_over_val_dataset")(
    HAND_WRITTEN
    + """
def make(config):
    val = get_val_dataset(data["b"], split_part="train", batch_size=2, worker_config=config)
    return Tag(val, worker_config=config)

config = wc()
config.worker_activate(0)  # the reference's datasets load samples only in an active worker
by_hand = make(config)
it = iter(by_hand)
head = [next(it) for _ in range(4)]
state = by_hand.save_state()
resumed = make(config)
resumed.restore_state(state)
rest = list(resumed)
config.worker_deactivate()
return {
    "by_hand": [head, rest],
    "loaders": {f"workers{n}": run_and_resume(make, 5, n) for n in (0, 2)},
}
"""
)

program("hand_written_factory_and_energon_wrappers")(
    HAND_WRITTEN
    + """
from megatron.energon.flavors.base_dataset import BaseCoreDatasetFactory

class CounterFactory(BaseCoreDatasetFactory):
    def __init__(self, n, *, worker_config):
        self.n = n
        self.worker_config = worker_config

    def __len__(self):
        return self.n

    def build(self, worker_rotation_offset=0):
        return Counter(self.n, self.worker_config)

    def as_file_store(self):
        raise NotImplementedError

def make(config):
    built = CounterFactory(4, worker_config=config).build()
    mapped = MapDataset(built, lambda x: x.upper(), worker_config=config)
    return BatchDataset(mapped, batch_size=3, batcher=lambda xs: "+".join(xs), worker_config=config)

factory = CounterFactory(4, worker_config=wc())
return {
    "factory": [isinstance(factory, BaseCoreDatasetFactory), len(factory), type(factory.build()).__name__],
    "loaders": {f"workers{n}": run_and_resume(make, 2, n) for n in (0, 2)},
}
"""
)
