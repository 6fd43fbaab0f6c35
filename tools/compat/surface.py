#!/usr/bin/env python3
"""How much of Megatron-Energon's importable surface energon serves through its alias.

Two steps, each run by its own interpreter:

    <reference venv>/bin/python tools/compat/surface.py dump surface.json
        imports every public module of the installed ``megatron.energon`` and writes what a user can
        reach there: each class, function and click command the package defines (also when a module
        re-exports it), each class's own public members, every signature (parameter names, kinds and
        defaults) and each click command's parameters. Only introspection: nothing is read from source.

    <energon venv>/bin/python tools/compat/surface.py check surface.json [--json gaps.json]
        imports ``energon.megatron_alias`` and looks every module, name and member up through it.
        Prints the four headline numbers (modules, names, class members, signatures), then the
        classes users call, subclass or invoke (``USER_CLASSES``) checked strictly: every public
        member must exist and every signature must have the same parameters and defaults.

    ... check surface.json --docs docs/compat.md
        also rewrites the generated section of docs/compat.md: the numbers and every remaining gap
        with the reason from ``tools/compat/gaps.py``.

The test ``tests/compat/test_surface.py`` runs both steps against the reference side venv.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import enum
import importlib
import inspect
import json
import pkgutil
import sys
import warnings
from pathlib import Path
from typing import Any

ROOT = "megatron.energon"

# The classes (by the reference's own module and name) that user code calls, subclasses or invokes:
# factories, datasets and wrappers, task encoders, sample types, EPath, loaders, WorkerConfig, the
# cache pools and file stores. Functions users call as decorators or entry points are listed too.
# Click command objects are always strict.
USER_CLASSES: tuple[str, ...] = (
    # factories
    "flavors.base_dataset.BaseCoreDatasetFactory",
    "flavors.webdataset.base_webdataset.BaseWebdatasetFactory",
    "flavors.webdataset.default_generic_webdataset.DefaultGenericWebdatasetFactory",
    "flavors.webdataset.default_decoder_webdataset.DefaultDecoderWebdatasetFactory",
    "flavors.webdataset.standard_webdataset.StandardWebdatasetFactory",
    "flavors.webdataset.joined_webdataset.JoinedWebdatasetFactory",
    "flavors.crude.CrudeWebdataset",
    "flavors.jsonl.crude_jsonl_dataset.CrudeJsonlDatasetFactory",
    "flavors.jsonl.crude_jsonl_dataset.DefaultCrudeJsonlDatasetFactory",
    *(
        f"flavors.{module}.{name}Webdataset"
        for module, name in (
            ("captioning", "Captioning"),
            ("image", "Image"),
            ("image_classification", "ImageClassification"),
            ("interleaved", "Interleaved"),
            ("multichoice_vqa", "MultiChoiceVQA"),
            ("ocr", "OCR"),
            ("similarity_interleaved", "SimilarityInterleaved"),
            ("text", "Text"),
            ("vid_qa", "VidQA"),
            ("vqa", "VQA"),
            ("vqa_and_ocr", "VQAOCR"),
        )
    ),
    # datasets and wrappers
    "flavors.base_dataset.SavableDataset",
    "wrappers.base.BaseWrapperDataset",
    *(
        f"wrappers.{module}.{name}"
        for module, name in (
            ("batch_dataset", "BatchDataset"),
            ("blend_dataset", "BlendDataset"),
            ("concat_dataset", "ConcatDataset"),
            ("epochize_dataset", "EpochizeDataset"),
            ("filter_dataset", "FilterDataset"),
            ("gc_dataset", "GcDataset"),
            ("group_batch_dataset", "GroupBatchDataset"),
            ("iter_map_dataset", "IterMapDataset"),
            ("limit_dataset", "LimitDataset"),
            ("log_sample_dataset", "LogSampleDataset"),
            ("map_dataset", "MapDataset"),
            ("mix_batch_dataset", "MixBatchDataset"),
            ("packing_dataset", "PackingDataset"),
            ("repeat_dataset", "RepeatDataset"),
            ("shuffle_buffer_dataset", "ShuffleBufferDataset"),
            ("watchdog_dataset", "WatchdogDataset"),
        )
    ),
    # task encoders and their decorators
    "task_encoder.base.TaskEncoder",
    "task_encoder.base.DefaultTaskEncoder",
    "task_encoder.base.AugmentTaskEncoder",
    "task_encoder.base.stateless",
    "task_encoder.base.batch_list",
    "task_encoder.base.batch_pad_stack",
    "task_encoder.base.batch_stack",
    "task_encoder.base.generic_batch",
    "task_encoder.cooking.Cooker",
    "task_encoder.cooking.cooker",
    "task_encoder.loader.get_train_dataset",
    "task_encoder.loader.get_val_dataset",
    "task_encoder.loader.get_val_datasets",
    # sample types
    "flavors.base_dataset.Sample",
    "flavors.base_dataset.PinMemoryMixin",
    "flavors.crude.CrudeSample",
    "flavors.captioning.CaptioningSample",
    "flavors.image.ImageSample",
    "flavors.image_classification.ImageClassificationSample",
    "flavors.interleaved.InterleavedSample",
    "flavors.multichoice_vqa.MultiChoiceVQASample",
    "flavors.ocr.OCRSample",
    "flavors.similarity_interleaved.SimilarityInterleavedSample",
    "flavors.text.TextSample",
    "flavors.vid_qa.VidQASample",
    "flavors.vqa.VQASample",
    "flavors.vqa_and_ocr.VQAOCRSample",
    "task_encoder.base.Batch",
    "edataclass.edataclass",
    # paths, loaders, worker config
    "epathlib.epath.EPath",
    "savable_loader.SavableDataLoader",
    "savable_loader.BasicDataLoader",
    "loader.get_loader",
    "loader.get_savable_loader",
    "worker.WorkerConfig",
    # cache pools, lazies and file stores
    "cache.base.CachePool",
    "cache.base.FileStore",
    "cache.base.Lazy",
    "cache.base.MockLazy",
    "cache.no_cache.NoCachePool",
    "cache.no_cache.DirectLazy",
    "cache.file_cache_pool.FileStoreCachePool",
    "cache.file_cache_pool.FileCacheLazy",
    "cache.file_store.DecodeFileStore",
    "cache.file_store.SystemFileStore",
    "cache.file_store.WebdatasetFileStore",
    # metadatasets and programmatic preparation
    "metadataset.loader.load_dataset",
    "metadataset.loader.prepare_metadataset",
    "media.filesystem_prepare.prepare_filesystem_dataset",
    "sample_utils.format_sample_detailed",
    "sample_utils.format_sample_compact",
)


# -- normalised descriptions (the same code runs on both sides) ------------------------------------


def describe_default(value: Any) -> str | None:
    """A default value as text that is the same for equal defaults on both sides (no addresses)."""
    if value is inspect.Parameter.empty:
        return None
    if isinstance(value, enum.Enum):
        return f"{type(value).__name__}.{value.name}"
    if value is None or isinstance(value, (bool, int, float, str, bytes)):
        return repr(value)
    if isinstance(value, (tuple, list, frozenset, set, dict)) and len(repr(value)) < 200:
        if "<" not in repr(value):
            return repr(value)
    if inspect.isclass(value):
        return f"<class {value.__name__}>"
    if callable(value) and hasattr(value, "__name__"):
        return f"<function {value.__name__}>"
    if type(value).__name__ == "_HAS_DEFAULT_FACTORY_CLASS":
        return "<factory>"
    return f"<{type(value).__name__} object>"


def describe_signature(obj: Any) -> list[list[Any]] | None:
    """``[[name, kind, default], ...]`` of a callable, or None when it has no signature."""
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    return [[p.name, p.kind.name, describe_default(p.default)] for p in sig.parameters.values()]


def is_click_command(obj: Any) -> bool:
    return any(
        c.__name__ == "Command" and c.__module__.startswith("click") for c in type(obj).__mro__
    )


def _command_default(param: Any) -> str | None:
    """A parameter's default as a user sees it: unset, None and (for flags) False all mean
    "not given"; paths are compared as text."""
    default = param.default
    if type(default).__name__ == "Sentinel" or default is None:
        return None
    if getattr(param, "is_flag", False) and default is False:
        return None
    if isinstance(default, Path):
        default = str(default)
    return describe_default(default)


def _subcommands(command: Any) -> list[str]:
    if not hasattr(command, "list_commands"):
        return []
    import click

    return sorted(command.list_commands(click.Context(command)))


def describe_command(command: Any) -> dict[str, Any]:
    """A click command: its name, parameters (name, flags, default, required) and sub-commands."""
    params = {
        p.name: [sorted(p.opts), _command_default(p), bool(p.required), type(p).__name__]
        for p in command.params
    }
    return {"command_name": command.name, "params": params, "subcommands": _subcommands(command)}


def has_member(cls: Any, name: str) -> bool:
    """A class attribute, a dataclass field, an annotated attribute or an ``__init__`` parameter
    (instances have it) of ``cls`` or its bases."""
    if hasattr(cls, name):
        return True
    if not inspect.isclass(cls):
        return False
    if name in getattr(cls, "__dataclass_fields__", {}):
        return True
    if any(name in getattr(base, "__annotations__", {}) for base in cls.__mro__):
        return True
    try:
        return name in inspect.signature(cls).parameters
    except (TypeError, ValueError):
        return False


def _member_object(cls: type, name: str) -> Any:
    value = inspect.getattr_static(cls, name)
    return value.__func__ if isinstance(value, (classmethod, staticmethod)) else value


def describe_class_members(cls: type) -> dict[str, Any]:
    """The class's own public members (methods, classmethods, properties, attributes and dataclass
    fields), each with its signature when callable."""
    names = {m for m in vars(cls) if not m.startswith("_")}
    names |= {f.name for f in getattr(cls, "__dataclass_fields__", {}).values()}
    out = {}
    for member in sorted(n for n in names if not n.startswith("_")):
        try:
            value = _member_object(cls, member)
        except AttributeError:  # a dataclass field without class-level default
            out[member] = None
            continue
        out[member] = describe_signature(value) if inspect.isroutine(value) else None
    return out


def describe_name(obj: Any) -> dict[str, Any]:
    if is_click_command(obj):
        return {"kind": "command", **describe_command(obj)}
    item: dict[str, Any] = {
        "kind": "class" if inspect.isclass(obj) else "function",
        "qualname": f"{obj.__module__}.{obj.__qualname__}",
        "signature": describe_signature(obj),
    }
    if inspect.isclass(obj):
        item["members"] = describe_class_members(obj)
    return item


# -- dump (reference side) -----------------------------------------------------------------------


def _public_modules() -> list[str]:
    root = importlib.import_module(ROOT)
    names = [ROOT] + [m.name for m in pkgutil.walk_packages(root.__path__, ROOT + ".")]
    return [n for n in names if not any(part.startswith("_") for part in n.split(".")[2:])]


def _defined_in_package(obj: Any) -> bool:
    if is_click_command(obj):
        return True
    if not (inspect.isclass(obj) or inspect.isfunction(obj)):
        return False
    return (getattr(obj, "__module__", "") or "").startswith(ROOT)


def _constant(value: Any) -> bool:
    return value is None or isinstance(value, (bool, int, float, str, Path))


def dump_module(module: Any) -> dict[str, Any]:
    names, constants = {}, {}
    for attr in dir(module):
        if attr.startswith("_"):
            continue
        obj = getattr(module, attr)
        if _defined_in_package(obj):
            names[attr] = describe_name(obj)
        elif attr.isupper() and _constant(obj):
            constants[attr] = type(obj).__name__
    return {"names": names, "constants": constants}


def dump(path: str) -> None:
    warnings.simplefilter("ignore")
    out = {}
    for name in _public_modules():
        try:
            module = importlib.import_module(name)
        except Exception as exc:  # the reference needs an optional dependency here
            out[name] = {"error": f"{type(exc).__name__}: {exc}"[:200]}
            continue
        out[name] = dump_module(module)
    Path(path).write_text(json.dumps(out, indent=1, sort_keys=True))
    n_names = sum(len(v.get("names", ())) for v in out.values())
    print(f"{len(out)} modules, {n_names} names written to {path}")


# -- check (energon side) ------------------------------------------------------------------------


def is_user_name(module: str, name: str, item: dict[str, Any]) -> bool:
    """Strictly checked: a click command, or one of ``USER_CLASSES`` (by its defining module)."""
    if item["kind"] == "command":
        return True
    return item["qualname"][len(ROOT) + 1 :] in USER_CLASSES


@dataclasses.dataclass
class Report:
    totals: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    gaps: dict[str, list[str]] = dataclasses.field(
        default_factory=lambda: {
            k: [] for k in ("modules", "names", "members", "signatures", "user")
        }
    )
    user_checked: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    # signatures of classes users call that differ but accept every call the reference's accepts
    compatible: list[str] = dataclasses.field(default_factory=list)
    # the same for the other signatures counted in gaps["signatures"]
    compatible_signatures: set[str] = dataclasses.field(default_factory=set)

    def needing_reasons(self) -> list[str]:
        """Every gap that must have a recorded reason: modules, names, missing members,
        signatures that reject calls the reference's accept, and the strict checks."""
        members = [f"{m}: missing" for m in self.gaps["members"]]
        signatures = [g for g in self.gaps["signatures"] if g not in self.compatible_signatures]
        return self.gaps["modules"] + self.gaps["names"] + members + signatures + self.gaps["user"]

    def numbers(self) -> dict[str, tuple[int, int]]:
        keys = ("modules", "names", "members", "signatures")
        return {k: (self.totals[k] - len(self.gaps[k]), self.totals[k]) for k in keys}

    def headline(self) -> str:
        parts = [
            f"{k.replace('members', 'class members')} {a}/{b}"
            for k, (a, b) in self.numbers().items()
        ]
        return ", ".join(parts)


def _names(sig: list[list[Any]] | None) -> list[str] | None:
    return None if sig is None else [p[0] for p in sig]


def _sig_text(sig: list[list[Any]] | None) -> str:
    if sig is None:
        return "(no signature)"
    parts = []
    for name, kind, default in sig:
        prefix = {"VAR_POSITIONAL": "*", "VAR_KEYWORD": "**"}.get(kind, "")
        text = prefix + name + ("" if default is None else f"={default}")
        parts.append(text if kind != "KEYWORD_ONLY" else f"{text}(kw)")
    return "(" + ", ".join(parts) + ")"


def signature_compatible(ref: list[list[Any]], ours: list[list[Any]] | None) -> bool:
    """Every call the reference's signature accepts, ours accepts with the same meaning: each
    reference parameter exists with its name, a kind that accepts the same calls and the same
    default; parameters we add are optional (a default, or ``*args`` / ``**kwargs``)."""
    if ours is None:
        return False
    by_name = {p[0]: p for p in ours}
    positional = [p[0] for p in ours if p[1] in ("POSITIONAL_ONLY", "POSITIONAL_OR_KEYWORD")]
    ref_positional = [p[0] for p in ref if p[1] in ("POSITIONAL_ONLY", "POSITIONAL_OR_KEYWORD")]
    if positional[: len(ref_positional)] != ref_positional:
        return False
    for name, kind, default in ref:
        mine = by_name.get(name)
        if mine is None or mine[2] != default and default is not None:
            return False
        if kind != mine[1] and not (kind == "KEYWORD_ONLY" and mine[1] == "POSITIONAL_OR_KEYWORD"):
            return False
    extra = [p for p in ours if p[0] not in {r[0] for r in ref}]
    return all(p[2] is not None or p[1] in ("VAR_POSITIONAL", "VAR_KEYWORD") for p in extra)


def _compare_signature(where: str, ref_sig: list[list[Any]], ours: Any, report: Report) -> None:
    report.user_checked["signatures"] += 1
    if ours == ref_sig:
        return
    line = f"{where}{_sig_text(ref_sig)}  vs ours {_sig_text(ours)}"
    if signature_compatible(ref_sig, ours):
        report.compatible.append(line)
    else:
        report.gaps["user"].append(line)


def _compare_command(where: str, ref: dict[str, Any], obj: Any, report: Report) -> None:
    report.user_checked["commands"] += 1
    if not is_click_command(obj):
        report.gaps["user"].append(f"{where}: not a click command ({type(obj).__name__})")
        return
    ours = describe_command(obj)
    for pname, spec in ref["params"].items():
        report.user_checked["command params"] += 1
        if pname not in ours["params"]:
            report.gaps["user"].append(f"{where}: no parameter {pname} ({'/'.join(spec[0])})")
        elif ours["params"][pname][:2] != spec[:2]:
            report.gaps["user"].append(
                f"{where}: parameter {pname} {ours['params'][pname][:2]} vs {spec[:2]}"
            )
    missing = sorted(set(ref["subcommands"]) - set(ours["subcommands"]))
    if missing:
        report.gaps["user"].append(f"{where}: no sub-commands {missing}")


def _compare_user_class(where: str, ref: dict[str, Any], obj: Any, report: Report) -> None:
    if ref["signature"] is not None:
        _compare_signature(where, ref["signature"], describe_signature(obj), report)
    for member, ref_sig in ref.get("members", {}).items():
        report.user_checked["members"] += 1
        if not has_member(obj, member):
            report.gaps["user"].append(f"{where}.{member}: missing")
            continue
        try:
            value = _member_object(obj, member)
        except AttributeError:  # an instance attribute (field, __init__ parameter)
            continue
        if ref_sig is not None:
            ours_sig = describe_signature(value) if inspect.isroutine(value) else None
            _compare_signature(f"{where}.{member}", ref_sig, ours_sig, report)


def check_name(
    mod_name: str, name: str, ref: dict[str, Any], module: Any, report: Report, strict: bool
) -> None:
    """Count one reference name; ``strict``: also compare it as a class users call (once per
    class, where the reference defines it, however many modules re-export it)."""
    where = f"{mod_name}.{name}"
    members = ref.get("members", {})
    report.totals["names"] += 1
    report.totals["members"] += len(members)
    obj = getattr(module, name, None) if module is not None else None
    if obj is None:
        report.gaps["names"].append(where)
        report.gaps["members"] += [f"{where}.{m}" for m in members]
        if strict:
            report.gaps["user"].append(f"{where}: missing")
        return
    if ref["kind"] != "command" and ref["signature"] is not None:
        report.totals["signatures"] += 1
        ours_sig = describe_signature(obj)
        if _names(ours_sig) != _names(ref["signature"]):
            line = f"{where}{_sig_text(ref['signature'])}  vs ours {_sig_text(ours_sig)}"
            report.gaps["signatures"].append(line)
            if signature_compatible(ref["signature"], ours_sig):
                report.compatible_signatures.add(line)
    for member in members:
        if not has_member(obj, member):
            report.gaps["members"].append(f"{where}.{member}")
    if not strict:
        return
    if ref["kind"] == "command":
        _compare_command(where, ref, obj, report)
    else:
        _compare_user_class(where, ref, obj, report)


def check(surface: dict[str, Any]) -> Report:
    import energon.megatron_alias  # noqa: F401

    warnings.simplefilter("ignore")
    report = Report()
    seen_strict: set[str] = set()
    for mod_name, entry in sorted(surface.items()):
        if "error" in entry:
            continue
        report.totals["modules"] += 1
        try:
            module = importlib.import_module(mod_name)
        except Exception as exc:
            report.gaps["modules"].append(f"{mod_name}: {type(exc).__name__}: {exc}"[:200])
            module = None
        for name, item in sorted(entry["names"].items()):
            key = item.get("qualname") or f"{mod_name}.{name}"
            strict = is_user_name(mod_name, name, item) and key not in seen_strict
            seen_strict.add(key)
            check_name(mod_name, name, item, module, report, strict)
        for const in entry["constants"]:
            report.totals["names"] += 1
            if module is None or not hasattr(module, const):
                report.gaps["names"].append(f"{mod_name}.{const} (constant)")
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("cmd", choices=["dump", "check"])
    parser.add_argument("surface")
    parser.add_argument("--json", help="write the numbers and every gap here")
    parser.add_argument("--docs", help="rewrite the generated section of this Markdown file")
    args = parser.parse_args(argv)
    if args.cmd == "dump":
        dump(args.surface)
        return 0
    report = check(json.loads(Path(args.surface).read_text()))
    print(report.headline())
    print(
        "classes users call:",
        dict(report.user_checked),
        f"gaps {len(report.gaps['user'])}, compatible differences {len(report.compatible)}",
    )
    from surface_docs import reason_for  # this script's folder is on the path

    unexplained = [gap for gap in report.needing_reasons() if reason_for(gap) is None]
    print(f"gaps without a recorded reason: {len(unexplained)}")
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "numbers": report.numbers(),
                    "user_checked": report.user_checked,
                    "gaps": report.gaps,
                    "compatible": report.compatible,
                    "unexplained": unexplained,
                },
                indent=1,
            )
        )
    if args.docs:
        from surface_docs import write_section

        write_section(Path(args.docs), report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
