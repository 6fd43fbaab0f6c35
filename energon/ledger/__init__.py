"""The data ledger: which samples a training step saw, and how often each sample was seen.

The order of the data is a pure function of (configuration, seed, logical streams) and a loader
state is a small cursor, so every step can be described without reading a sample: the ledger
builds the real stage chain of each stream over metadata instead of data (``simulate``), moves it
forward fast (``advance``, with a C loop for the pointer stages in ``native``), and describes the
micro-batches of a step (``ledger``) or counts exposures (``exposure``). Where hooks decide from
decoded data, a journal written by the loader (``journal``) says what was delivered; where neither
is possible the ledger says so instead of guessing (``energon.errors.NotSimulableError``).
"""
