"""The ``dataset.yaml`` assistant of ``energon prepare``: which sample type, and how its fields
are read from a sample's parts (a field map, or a ``sample_loader.py`` template to fill in).

Every question has an option that answers it (``--sample-type``, ``--field-map``), so the
assistant also runs with ``--non-interactive``; bad answers given as options fail before any
shard is scanned (:func:`choose_sample_type`, :func:`parse_field_map`).
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from energon import epath
from energon.format.dataset_yaml import (
    CRUDE_CLASS_NAME,
    crude_dataset_yaml,
    field_map_dataset_yaml,
    sample_loader_dataset_yaml,
    sample_loader_template,
    write_dataset_yaml,
    write_sample_loader_template,
)
from energon.format.layout import MAIN_FOLDER_NAME, SAMPLE_LOADER_FILENAME, nv_meta_dir

MAX_PART_TYPES_FOR_FIELD_MAP = 10
CRUDE_CHOICE_LABEL = "Crude sample (plain dict for cooking)"
CRUDE_ALIASES = {CRUDE_CLASS_NAME.lower(), "crudesample", "crude"}
_PART_NAME_RE = re.compile(r"^([^\[]+)")

# ---------------------------------------------------------------------------------------------
# Sample types offered by the assistant


@dataclass(frozen=True)
class FieldSpec:
    name: str
    type_name: str
    default: str | None  # repr of the default, None if the field is required


@dataclass(frozen=True)
class SampleTypeSpec:
    name: str
    fields: tuple[FieldSpec, ...]


def _field_spec(field: dataclasses.Field) -> FieldSpec:
    type_name = (
        field.type
        if isinstance(field.type, str)
        else getattr(field.type, "__name__", str(field.type))
    )
    if field.default is not dataclasses.MISSING:
        default: str | None = repr(field.default)
    elif field.default_factory is not dataclasses.MISSING:
        default = f"{getattr(field.default_factory, '__name__', 'factory')}()"
    else:
        default = None
    return FieldSpec(field.name, type_name, default)


def _spec_of(cls: type) -> SampleTypeSpec:
    fields = tuple(_field_spec(f) for f in dataclasses.fields(cls) if not f.name.startswith("__"))
    return SampleTypeSpec(cls.__name__, fields)


def available_sample_types() -> list[SampleTypeSpec]:
    """The built-in sample types, as ``energon.samples`` lists them: the reference's, then ours.

    Imported lazily: the samples package pulls in torch, which only the assistant needs.
    """
    from energon.samples import EXTRA_SAMPLE_TYPES, REFERENCE_SAMPLE_TYPES

    return [_spec_of(cls) for cls in REFERENCE_SAMPLE_TYPES + EXTRA_SAMPLE_TYPES]


def sample_type_menu() -> list[SampleTypeSpec | None]:
    """The assistant's numbered choices (``None``: crude samples), numbered as the reference's:
    its sample types, then crude samples, then the types only energon offers."""
    from energon.samples import EXTRA_SAMPLE_TYPES, REFERENCE_SAMPLE_TYPES

    return [*map(_spec_of, REFERENCE_SAMPLE_TYPES), None, *map(_spec_of, EXTRA_SAMPLE_TYPES)]


def parse_field_map(text: str, spec: SampleTypeSpec) -> dict[str, str]:
    """``--field-map``: a JSON object from fields of ``spec`` to part names."""
    try:
        field_map = json.loads(text)
    except json.JSONDecodeError as e:
        raise click.BadParameter(f"not valid JSON: {e}", param_hint="--field-map") from None
    if not isinstance(field_map, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in field_map.items()
    ):
        raise click.BadParameter(
            'must be a JSON object of strings, e.g. {"image": "jpg", "caption": "txt"}',
            param_hint="--field-map",
        )
    unknown = set(field_map) - {f.name for f in spec.fields}
    if unknown:
        raise click.BadParameter(
            f"{sorted(unknown)} are not fields of {spec.name} "
            f"(fields: {[f.name for f in spec.fields]})",
            param_hint="--field-map",
        )
    return field_map


# ---------------------------------------------------------------------------------------------
# dataset.yaml assistant


@dataclass(frozen=True)
class DatasetYamlOptions:
    """The dataset.yaml options of ``energon prepare``: the answers given up front."""

    skip: bool
    file_name: str
    sample_type: str | None
    field_map: str | None
    key_column: str | None = None  # Parquet/Arrow datasets only: the column of sample keys

    def check(self) -> None:
        """Fail on a bad ``--sample-type`` or ``--field-map`` before any shard is scanned."""
        if self.sample_type is not None and not self.skip:
            spec = choose_sample_type(self.sample_type)
            if spec is not None and self.field_map is not None:
                parse_field_map(self.field_map, spec)

    def ask_and_write(
        self,
        path: Path | str,
        part_names: list[str],
        non_interactive: bool,
        mode_like: Path | None = None,
    ) -> None:
        """Ask what the options leave open, then write the dataset.yaml (unless it is skipped)."""
        if not should_write_dataset_yaml(self.skip, self.sample_type, non_interactive):
            return
        content = ask_dataset_yaml(
            path, part_names, self.sample_type, self.field_map, non_interactive
        )
        if self.key_column is not None:
            content["key_column"] = self.key_column
        target = write_dataset_yaml(path, content, self.file_name, mode_like=mode_like)
        click.echo(f"Wrote {target}.")


def should_write_dataset_yaml(skip: bool, sample_type: str | None, non_interactive: bool) -> bool:
    """Whether to write a dataset.yaml: asked only when no option decides it."""
    if skip:
        return False
    if sample_type is not None:
        return True
    if non_interactive:
        click.echo("Skipping dataset.yaml creation (no --sample-type given).")
        return False
    return click.confirm("Do you want to create a dataset.yaml interactively?", default=True)


def ask_dataset_yaml(
    path: Path | str,
    part_names: list[str],
    sample_type: str | None,
    field_map: str | None,
    non_interactive: bool,
) -> dict[str, Any]:
    """The content of the dataset.yaml for a dataset whose samples have ``part_names``: crude
    samples, a field map, or a sample loader (whose template is written next to it)."""
    spec = choose_sample_type(sample_type)
    if spec is None:
        click.echo(
            "The dataset will yield plain dicts (crude samples); write a Cooker in your task "
            "encoder to turn them into samples."
        )
        return crude_dataset_yaml()
    _print_fields(spec)
    if field_map is not None:
        return field_map_dataset_yaml(spec.name, parse_field_map(field_map, spec))
    use_field_map = False
    if not non_interactive:
        if len(part_names) > MAX_PART_TYPES_FOR_FIELD_MAP:
            click.echo("More than 10 part types: write a sample_loader instead of a field map.")
        else:
            use_field_map = click.confirm(
                "Do you want to set a simple field_map[Y] (or write your own sample_loader [n])?",
                default=True,
            )
    if use_field_map:
        return field_map_dataset_yaml(spec.name, _ask_field_map(spec, part_names))
    _write_sample_loader(path, spec, part_names, non_interactive)
    return sample_loader_dataset_yaml(spec.name)


def choose_sample_type(sample_type: str | None) -> SampleTypeSpec | None:
    """The chosen type, or None for crude samples."""
    if sample_type is not None:
        if sample_type.lower() in CRUDE_ALIASES:
            return None
        specs = available_sample_types()
        for spec in specs:
            if spec.name == sample_type:
                return spec
        names = [s.name for s in specs] + [CRUDE_CLASS_NAME]
        raise click.BadParameter(
            f"unknown sample type {sample_type!r}; choose one of {', '.join(names)}",
            param_hint="--sample-type",
        )
    menu = sample_type_menu()
    click.echo("The following sample types are available:")
    for i, choice in enumerate(menu):
        click.echo(f"{i}. {choice.name if choice is not None else CRUDE_CHOICE_LABEL}")
    while True:
        number = click.prompt("Please enter a number to choose a class", type=int)
        if 0 <= number < len(menu):
            return menu[number]
        click.echo(f"Invalid choice {number}; enter a number from 0 to {len(menu) - 1}.")


def _describe_field(field: FieldSpec) -> str:
    default = f", default: {field.default}" if field.default is not None else ""
    return f"{field.type_name}{default}"


def _print_fields(spec: SampleTypeSpec) -> None:
    click.echo(f"{spec.name} has these fields:")
    for field in spec.fields:
        click.echo(f"  {field.name}: {_describe_field(field)}")


def _ask_field_map(spec: SampleTypeSpec, part_names: list[str]) -> dict[str, str]:
    """One prompt per field; each comma option must start with a part name that exists."""
    click.echo(
        "For each field, enter the part (file extension) to read it from. Use 'a,b' for "
        "fallbacks and 'json[key]' to read a value from a JSON part."
    )
    result: dict[str, str] = {}
    for field in spec.fields:
        while True:
            answer = click.prompt(
                f"Please enter a webdataset field name for '{field.name}' ({_describe_field(field)})",
                default="" if field.default is not None else None,
                show_default=False,
            ).strip()
            if not answer and field.default is not None:
                break
            bad = _unknown_parts(answer, part_names)
            if not bad:
                result[field.name] = answer
                break
            click.echo(f"Unknown part type(s) {bad}; found: {', '.join(part_names)}")
    return result


def _unknown_parts(answer: str, part_names: list[str]) -> list[str]:
    options = [option.strip() for option in answer.split(",")]
    names = [(m.group(1) if (m := _PART_NAME_RE.match(o)) else o) for o in options]
    return [n for n in names if n not in part_names]


def _write_sample_loader(
    path: Path | str, spec: SampleTypeSpec, part_names: list[str], non_interactive: bool
) -> None:
    fields = [(f.name, f.type_name) for f in spec.fields]
    if isinstance(path, str):
        url = epath.join(path, MAIN_FOLDER_NAME, SAMPLE_LOADER_FILENAME)
        if epath.is_file(url):
            click.echo(f"Keeping the existing {url}.")
            return
        epath.write_bytes(url, sample_loader_template(fields, part_names).encode("utf-8"))
        click.echo(f"Wrote a template {url}: fill in its TODOs.")
        return
    target = nv_meta_dir(path) / SAMPLE_LOADER_FILENAME
    overwrite = False
    if target.exists() and not non_interactive:
        overwrite = click.confirm(
            f"{target} exists. Overwrite it with a new template?", default=False
        )
    if write_sample_loader_template(path, fields, part_names, overwrite=overwrite):
        click.echo(f"Wrote a template {target}: fill in its TODOs.")
    else:
        click.echo(f"Keeping the existing {target}.")
