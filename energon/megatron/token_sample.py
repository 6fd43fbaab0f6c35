"""Token samples in task encoders that blend token data with other data.

A token leaf (:class:`energon.source.tokens.TokenLeaf`) yields Megatron batch dicts; these helpers
recognise them and turn other samples' token ids into the same shape, so both batch together.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from energon.megatron.gpt_dataset import GPTConfig, megatron_sample

_BOOKKEEPING_KEYS = ("__key__", "__restore_key__", "__subflavors__")  # what token samples carry


def is_token_sample(sample: Any) -> bool:
    """True for a sample of a token leaf (a Megatron batch dict), False for e.g. a ``Sample``."""
    return isinstance(sample, dict) and "tokens" in sample and "labels" in sample


def token_sample(token_ids: Any, config: GPTConfig, *, like: Any = None) -> dict[str, Any]:
    """Megatron's batch dict for ``token_ids`` (any length), shaped exactly like a token leaf's samples.

    The ids are cut to ``sequence_length + add_extra_token`` or padded with ``config.pad_token``, then
    turned into ``tokens``/``labels``/``loss_mask``/``position_ids``[/``attention_mask``] with the same
    rules as windows of a ``.bin/.idx`` prefix (padding is loss-masked). ``like`` (the sample being
    encoded: a ``Sample`` or a dict) passes on ``__key__``, ``__restore_key__`` and ``__subflavors__``,
    so the result batches together with token samples and stays restorable. Use it in
    ``encode_sample`` to turn multimodal/text samples into the token samples' format.
    """
    want = config.sequence_length + config.extra
    ids = np.asarray(token_ids, dtype=np.int64).reshape(-1)[:want]
    document = len(ids)  # one sample is one document
    if len(ids) < want:
        ids = np.concatenate([ids, np.full(want - len(ids), config.pad_token, np.int64)])
    sample = megatron_sample(ids, [document], config)
    if like is not None:
        for key in _BOOKKEEPING_KEYS:
            value = like.get(key) if isinstance(like, dict) else getattr(like, key, None)
            sample[key] = dict(value or {}) if key == "__subflavors__" else value
    return sample
