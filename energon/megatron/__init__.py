"""Megatron integration: token files, GPT/blend indices identical to megatron-core, start-up tools.

Modules: ``indexed`` (``.bin/.idx``), ``gpt_indices`` (the index algorithms and cache names),
``gpt_dataset`` (map-style GPT and blended datasets), ``token_leaf`` (the loader leaf),
``cache`` (prepare-cache / build-sequences), ``preprocess`` (JSONL -> tokens), ``epoch_index``
(determinism tools for map-style datasets). See docs/megatron.md.
"""
