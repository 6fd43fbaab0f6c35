"""The reference-shaped surface: Megatron-Energon's module paths, wrapper datasets, dataset factories,
metadataset loaders, cache pools, ``EPath`` and the other names its users import, mapped onto
energon's core. Everything reference-shaped lives here; the core never imports this package.

- ``modules``: which energon module each ``megatron.energon.X`` path is (used by the alias).
- ``megatron_energon``: the module object ``megatron.energon`` is under ``energon.megatron_alias``.
- ``wrappers``: ``MapDataset``, ``BlendDataset``, ``BatchDataset``, ... as nodes of one composition
  that compiles into energon's per-stream stage chains (plain-data state, restorable).
- ``task_encoder``: the composition behind the ``build_*`` hooks of the core ``TaskEncoder``.
- ``flavors`` / ``metadataset`` / ``dataset_config``: factories, ``load_dataset``, ``get_dataset_from_config``.
- ``cache``, ``epathlib``, ``errors``, ``av_reader``, ``filesystem_prepare``, ``transforms``.
"""
