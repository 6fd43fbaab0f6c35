"""Reference-style programs: ``get_train_dataset`` / ``get_val_dataset`` with their documented
keywords, every built-in sample type, dataset.yaml features and the decoders (see programs.py)."""

from tests.compat.programs import program

program("val_keywords_drop_last_and_limit")(
    """
w = wc()
full = get_val_dataset(data["a"], split_part="val", batch_size=4, worker_config=w)
dropped = get_val_dataset(data["a"], split_part="val", batch_size=4, batch_drop_last=True, worker_config=w)
limited = get_val_dataset(data["a"], split_part="val", batch_size=4, limit=2, worker_config=w)
return [[len(b.__key__) for b in get_loader(d)] for d in (full, dropped, limited)]
"""
)

program("val_subflavors_keyword")(
    """
ds = get_val_dataset(data["b"], split_part="train", batch_size=None, worker_config=wc(),
                     subflavors={"extra": 7})
s = next(iter(get_loader(ds)))
return [s.__key__, s.__subflavors__]
"""
)

program("val_two_workers_every_sample_once")(
    """
ds = get_val_dataset(data["a"], split_part="val", batch_size=3, worker_config=wc(workers=2))
loader = get_loader(ds)
keys_seen = [k for b in loader for k in keys(b)]
return {"len": len(loader), "n": len(keys_seen), "sorted": sorted(keys_seen)}
"""
)

program("val_two_ranks_cover_the_split")(
    """
seen = []
for rank in range(2):
    ds = get_val_dataset(data["a"], split_part="val", batch_size=None, worker_config=wc(rank=rank, world=2))
    seen += [s.__key__ for s in get_loader(ds)]
return sorted(set(seen))
"""
)

program("train_repeat_false_is_one_epoch")(
    """
ds = get_train_dataset(data["a"], batch_size=None, shuffle_buffer_size=None, max_samples_per_sequence=None,
                       worker_config=wc(), repeat=False)
got = [s.__key__ for s in get_loader(ds)]
return {"n": len(got), "sorted": sorted(got)}
"""
)

program("train_epoch_is_a_permutation")(
    """
out = []
for sbs, msps in ((None, None), (10, 3), (5, None)):
    ds = get_train_dataset(data["a"], batch_size=None, shuffle_buffer_size=sbs, max_samples_per_sequence=msps,
                           worker_config=wc(workers=1))
    it = iter(get_loader(ds))
    first = [next(it).__key__ for _ in range(40 * 4)]
    out.append([sbs, msps, len(set(first[:40 * 4]))])
return out
"""
)

program("train_unshuffled_order")(
    """
ds = get_train_dataset(data["b"], batch_size=5, shuffle_buffer_size=None, max_samples_per_sequence=None,
                       worker_config=wc(), shuffle_over_epochs_multiplier=None, parallel_shard_iters=1)
it = iter(get_loader(ds))
return [keys(next(it)) for _ in range(8)]
"""
)

program("train_virtual_epoch_length")(
    """
ds = get_train_dataset(data["a"], batch_size=3, shuffle_buffer_size=None, max_samples_per_sequence=None,
                       worker_config=wc(workers=2), virtual_epoch_length=7)
loader = get_savable_loader(ds)
passes = [len(list(loader)) for _ in range(3)]
return [len(loader), passes]
"""
)

program("train_parallel_shard_iters_and_sample_type")(
    """
ds = get_train_dataset(data["b"], batch_size=None, shuffle_buffer_size=None, max_samples_per_sequence=None,
                       worker_config=wc(), parallel_shard_iters=2, sample_type=TextSample)
it = iter(get_loader(ds))
got = [next(it) for _ in range(30)]
return [type(got[0]).__name__, sorted({s.__key__ for s in got}) == sorted("b%03d" % i for i in range(30))]
"""
)

program("dataset_and_split_config_keywords")(
    """
ds = get_val_dataset(data["b"], split_part="val", batch_size=None, worker_config=wc(),
                     dataset_config="dataset_alt.yaml", split_config="split_alt.yaml")
got = list(get_loader(ds))
return [len(got), got[0].__subflavors__, got[0].text]
"""
)

program("deprecated_decode_keywords")(
    """
import warnings
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    raw = get_val_dataset(data["cap"], split_part="train", batch_size=None, worker_config=wc(), auto_decode=False,
                          task_encoder=DefaultTaskEncoder())
    pil = get_val_dataset(data["cap"], split_part="train", batch_size=None, worker_config=wc(), image_decode="pil",
                          task_encoder=DefaultTaskEncoder())
    handled = get_val_dataset(data["cap"], split_part="train", batch_size=None, worker_config=wc(),
                              handler=reraise_exception, task_encoder=DefaultTaskEncoder())
r, p, h = (next(iter(get_loader(d))) for d in (raw, pil, handled))
return [type(r.image).__name__, type(p.image).__name__, p.image.size, list(h.image.shape)]
"""
)

program("captioning_samples_and_batches")(
    """
ds = get_val_dataset(data["cap"], split_part="train", batch_size=4, worker_config=wc())
out = []
for b in get_loader(ds):
    out.append([type(b).__name__, keys(b), list(b.image.shape), str(b.image.dtype), b.caption])
return out
"""
)

program("vqa_samples")(
    """
ds = get_val_dataset(data["vqa"], split_part="train", batch_size=None, worker_config=wc())
return [[type(s).__name__, s.__key__, s.context, s.answers, list(s.image.shape)] for s in get_loader(ds)]
"""
)

program("image_classification_samples")(
    """
ds = get_val_dataset(data["cls"], split_part="train", batch_size=5, worker_config=wc())
return [[keys(b), list(b.label) if hasattr(b.label, "__iter__") else b.label, list(b.image.shape)]
        for b in get_loader(ds)]
"""
)

program("dataset_sample_loader_module")(
    """
ds = get_val_dataset(data["sl"], split_part="train", batch_size=None, worker_config=wc())
return [[s.__key__, s.text] for s in get_loader(ds)]
"""
)

program("sample_source_info")(
    """
ds = get_val_dataset(data["b"], split_part="train", batch_size=None, worker_config=wc())
s = next(iter(get_loader(ds)))
src = s.__sources__[0]
return [type(src).__name__, str(src.dataset_path).endswith("/b"), src.index, src.shard_name, list(src.file_names)]
"""
)

program("jsonl_crude_dataset_with_cooker")(
    """
@stateless
def cook(sample):
    import json as _json
    record = _json.loads(sample["json"]) if isinstance(sample["json"], (bytes, str)) else sample["json"]
    return TextSample(**basic_sample_keys(sample), text=record["text"].upper())
class TE(DefaultTaskEncoder):
    cookers = [Cooker(cook)]
ds = get_val_dataset(data["jsonl"], split_part="train", batch_size=6, worker_config=wc(), task_encoder=TE())
return [[len(keys(b)), b.text] for b in get_loader(ds)]
"""
)

program("cookers_selected_by_subflavors")(
    """
@stateless
def plain(sample):
    return TextSample(**basic_sample_keys(sample), text="plain")
@stateless
def special(sample):
    return TextSample(**basic_sample_keys(sample), text="special:" + sample["txt"])
class TE(DefaultTaskEncoder):
    cookers = [Cooker(special, has_subflavors={"c": 1}), Cooker(plain)]
ds = get_val_dataset(data["crude"], split_part="train", batch_size=None, worker_config=wc(), task_encoder=TE())
return [s.text for s in get_loader(ds)]
"""
)

program("cooker_reads_filesystem_aux")(
    """
@stateless
@cooker
def cook(sample, store, other):
    extra = store.get(sample["__key__"] + ".extra", sample)
    text = extra.decode() if isinstance(extra, bytes) else extra
    return TextSample(**basic_sample_keys(sample), text=text + "|" + other.get(sample["__key__"] + ".txt", sample))
class TE(DefaultTaskEncoder):
    cookers = [Cooker(cook)]
ds = get_val_dataset(data["mds_aux"], split_part="train", batch_size=None, worker_config=wc(), task_encoder=TE())
return [[s.__key__, s.text] for s in get_loader(ds)]
"""
)

program("cooker_with_primary_store")(
    """
@stateless
@cooker(need_primary=True)
def cook(sample, primary):
    again = primary.get(sample["__key__"] + ".txt", sample)
    return TextSample(**basic_sample_keys(sample), text=again if isinstance(again, str) else again.decode())
class TE(DefaultTaskEncoder):
    cookers = [Cooker(cook)]
ds = get_val_dataset(data["crude"], split_part="train", batch_size=None, worker_config=wc(), task_encoder=TE())
return [[s.__key__, s.text] for s in get_loader(ds)]
"""
)

program("av_crude_dataset_decodes_video")(
    """
@stateless
def cook(sample):
    decoder = sample["mp4"]
    frames = decoder.get_frames()
    return TextSample(**basic_sample_keys(sample), text="%s %s %s" % (type(decoder).__name__,
                      list(frames.video_clips[0].shape), sample["txt"]))
class TE(DefaultTaskEncoder):
    cookers = [Cooker(cook)]
ds = get_val_dataset(data["av"], split_part="train", batch_size=None, worker_config=wc(), task_encoder=TE())
return [s.text for s in get_loader(ds)]
"""
)

program("sample_decoder_modes")(
    """
out = []
for mode in ("torchrgb", "torchl", "rgb8", "pil", "l8"):
    class TE(DefaultTaskEncoder):
        pass
    te = TE()
    te.decoder = SampleDecoder(image_decode=mode)
    ds = get_val_dataset(data["cap"], split_part="train", batch_size=None, worker_config=wc(), task_encoder=te)
    img = next(iter(get_loader(ds))).image
    shape = list(img.shape) if hasattr(img, "shape") else list(img.size)
    out.append([mode, type(img).__name__, shape, str(getattr(img, "dtype", getattr(img, "mode", "")))])
return out
"""
)

program("decoder_none_gives_bytes")(
    """
class TE(DefaultTaskEncoder):
    decoder = None
ds = get_val_dataset(data["cap"], split_part="train", batch_size=None, worker_config=wc(), task_encoder=TE())
s = next(iter(get_loader(ds)))
return [type(s.image).__name__, s.image[:4], type(s.caption).__name__]
"""
)

program("text_batches_with_default_batching")(
    """
ds = get_val_dataset(data["b"], split_part="train", batch_size=7, worker_config=wc())
out = []
for b in get_loader(ds):
    out.append([type(b).__name__, b.__key__, b.text, b.__subflavors__[0], len(b.__restore_key__) > 0])
return out
"""
)

program("every_sample_type_fields_and_batching")(
    """
import dataclasses
types = [CaptioningSample, ImageSample, ImageClassificationSample, InterleavedSample, MultiChoiceVQASample,
         OCRSample, SimilarityInterleavedSample, TextSample, VidQASample, VQASample, CrudeSample]
out = []
for t in types:
    if t is CrudeSample:
        out.append([t.__name__, issubclass(t, dict)])
        continue
    names = [f.name for f in dataclasses.fields(t)]
    out.append([t.__name__, names])
return out
"""
)

program("train_shuffle_over_epochs_multiplier")(
    """
out = []
for mult in (1, 2, -1):
    ds = get_train_dataset(data["b"], batch_size=None, shuffle_buffer_size=None, max_samples_per_sequence=None,
                           worker_config=wc(), shuffle_over_epochs_multiplier=mult)
    it = iter(get_loader(ds))
    got = [next(it).__key__ for _ in range(120)]
    out.append([mult, len(set(got))])
return out
"""
)
