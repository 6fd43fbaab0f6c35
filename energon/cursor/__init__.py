"""Editing the data cursor: skip steps, exclude data, move to an edited configuration.

A loader state is a small cursor over a plan that is a pure function of the configuration, so it
can be edited offline and resumed: :func:`~energon.cursor.skip.skip_steps` moves it past a range
of steps as if they had been consumed, :func:`~energon.cursor.exclude.exclude_samples` removes
samples from the rest of training without moving anything else, and
:func:`~energon.cursor.migrate.migrate_states` carries it over to an edited metadataset (weights
changed, sources added or removed) keeping every continuing source's place. Each edit is recorded
in the state as plain data (:mod:`energon.plan.edits`), survives save/restore and elastic restore,
and is what the ledger reads to describe what happened (docs/ledger.md).
"""
