"""Megatron integration: token files, GPT/blend indices identical to megatron-core, start-up tools.

Modules: ``indexed`` (``.bin/.idx``), ``gpt_indices`` (the index algorithms and cache names),
``gpt_dataset`` (map-style GPT and blended datasets), ``token_sample`` (token samples in task
encoders), ``cache`` (prepare-cache / build-sequences), ``preprocess`` (JSONL -> tokens),
``epoch_index`` (determinism tools for map-style datasets). The loader's leaf over these datasets
is :class:`energon.source.tokens.TokenLeaf`; nothing here imports :mod:`energon.source`.
See docs/megatron.md.
"""
