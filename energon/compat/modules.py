"""Where each of Megatron-Energon's module paths lives in energon.

``REFERENCE_MODULES`` maps a module path below ``megatron.energon`` (``""`` is the package itself) to
the ONE energon module that plays its part, so ``import megatron.energon.X`` (through
``energon.megatron_alias``) gives that very module object and ``isinstance`` checks agree. Paths that
are just the core point into the core; paths that need the reference's own objects point into
``energon.compat``. ``megatron.energon`` itself is ``energon.compat.megatron_energon``, which serves
energon's public names (so submodule imports never rebind a name of ``energon``). Several reference
paths may share one energon module; that module then serves the names of all of them.
"""

from __future__ import annotations

_FLAVOR_MODULES = (
    "flavors.base_dataset",
    "flavors.captioning",
    "flavors.crude",
    "flavors.image",
    "flavors.image_classification",
    "flavors.interleaved",
    "flavors.multichoice_vqa",
    "flavors.ocr",
    "flavors.similarity_interleaved",
    "flavors.text",
    "flavors.vid_qa",
    "flavors.vqa",
    "flavors.vqa_and_ocr",
    "flavors.jsonl",
    "flavors.jsonl.crude_jsonl_dataset",
    "flavors.webdataset",
    "flavors.webdataset.base_webdataset",
    "flavors.webdataset.default_decoder_webdataset",
    "flavors.webdataset.standard_webdataset",
    "flavors.webdataset.joined_webdataset",
)

_WRAPPER_MODULES = (
    "wrappers.base",
    "wrappers.batch_dataset",
    "wrappers.blend_dataset",
    "wrappers.concat_dataset",
    "wrappers.epochize_dataset",
    "wrappers.filter_dataset",
    "wrappers.gc_dataset",
    "wrappers.group_batch_dataset",
    "wrappers.iter_map_dataset",
    "wrappers.limit_dataset",
    "wrappers.log_sample_dataset",
    "wrappers.map_dataset",
    "wrappers.mix_batch_dataset",
    "wrappers.packing_dataset",
    "wrappers.repeat_dataset",
    "wrappers.shuffle_buffer_dataset",
    "wrappers.skip",
    "wrappers.watchdog_dataset",
    "wrappers.buffer",
)

REFERENCE_MODULES: dict[str, str] = {
    "": "energon.compat.megatron_energon",
    "av": "energon.compat.av",
    "av.av_data": "energon.compat.av",
    "av.av_init": "energon.compat.av",
    "av.av_decoder": "energon.compat.av",
    "av.utils": "energon.compat.av",
    "av.av_reader": "energon.compat.av_reader",
    "cache": "energon.compat.cache",
    "cache.base": "energon.compat.cache",
    "cache.file_store": "energon.compat.cache",
    "cache.no_cache": "energon.compat.cache",
    "cache.file_cache_pool": "energon.compat.cache",
    "cli": "energon.cli",
    "cli.main": "energon.cli.main",
    "dataset_config": "energon.compat.dataset_config",
    "edataclass": "energon.samples.edataclass",
    "epathlib": "energon.compat.epathlib",
    "epathlib.epath": "energon.compat.epathlib",
    "errors": "energon.compat.errors",
    "flavors": "energon.compat.flavors",
    **{path: "energon.compat.flavors" for path in _FLAVOR_MODULES},
    "flavors.webdataset.config": "energon.compat.webdataset_config",
    **{
        f"flavors.webdataset.{name}": f"energon.compat.webdataset.{name}"
        for name in (
            "aggregator_pool",
            "default_generic_webdataset",
            "field_access",
            "indexing",
            "itar",
            "itar_reader",
            "metadata",
            "prepare",
            "sample_loader",
            "sharder",
            "structs",
            "thread_local_sqlite",
        )
    },
    **{
        f"flavors.jsonl.{name}": f"energon.compat.jsonl.{name}"
        for name in (
            "ijsonl",
            "ijsonl_reader",
            "jsonl_prepare",
        )
    },
    "retry_stream": "energon.compat.retry_stream",
    "flavors.webdataset.sample_decoder": "energon.compat.sample_decoder",
    "flavors.webdataset.empty_dataset_error": "energon.errors",
    "loader": "energon.compat.loader",
    "media": "energon.compat.media",
    "media.metadata": "energon.compat.media",
    "media.extractor": "energon.compat.media",
    "media.filesystem_prepare": "energon.compat.filesystem_prepare",
    "metadataset": "energon.compat.metadataset",
    "metadataset.loader": "energon.compat.metadataset",
    "metadataset.loader_interface": "energon.compat.metadataset",
    "metadataset.metadataset": "energon.compat.metadataset_v1",
    "metadataset.join_dataset_loader": "energon.compat.join_dataset_loader",
    "metadataset.metadataset_v2": "energon.compat.metadataset_v2",
    "metadataset.dataset_loader": "energon.compat.metadataset",
    "sample_utils": "energon.sample_text",
    "savable_loader": "energon.compat.savable_loader",
    "source_info": "energon.compat.source_info",
    "task_encoder": "energon.compat.task_encoder",
    "task_encoder.base": "energon.compat.task_encoder",
    "task_encoder.cooking": "energon.compat.task_encoder",
    "task_encoder.loader": "energon.compat.task_encoder",
    "transforms": "energon.compat.transforms",
    "transforms.common": "energon.compat.transforms",
    "transforms.custom": "energon.compat.transforms",
    "transforms.mappers": "energon.compat.transforms",
    "transforms.merge": "energon.compat.transforms",
    "tools": "energon.cli.tools",
    **{
        f"tools.{name}": f"energon.cli.tools.{name}"
        for name in (
            "analyze_debug",
            "checkpoint",
            "info",
            "lint",
            "mount",
            "prepare",
            "prepare_media",
            "preview",
        )
    },
    "worker": "energon.compat.worker",
    "bracecollapse": "energon.compat.bracecollapse",
    "deprecation": "energon.compat.deprecation",
    "rng": "energon.compat.rng",
    "savable": "energon.compat.savable",
    "state": "energon.compat.savable",
    "watchdog": "energon.compat.watchdog",
    "eyaml": "energon.compat.eyaml",
    "typed_converter": "energon.compat.typed_converter",
    "fork_hook": "energon.compat.fork_hook",
    "module_loader": "energon.compat.module_loader",
    "local_copy": "energon.compat.local_copy",
    "epathlib.rclone_config": "energon.compat.rclone_config",
    "wrappers": "energon.compat.wrappers",
    **{path: f"energon.compat.{path}" for path in _WRAPPER_MODULES},
}


def energon_module_for(reference_name: str) -> str | None:
    """``megatron.energon.wrappers.map_dataset`` -> ``energon.compat.wrappers`` (None if unmapped)."""
    if reference_name == "megatron.energon":
        return REFERENCE_MODULES[""]
    prefix = "megatron.energon."
    if not reference_name.startswith(prefix):
        return None
    return REFERENCE_MODULES.get(reference_name[len(prefix) :])
