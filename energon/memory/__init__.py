"""Recycled memory: a pool of large short-lived buffers (``buffer_pool``) and the shared-memory arena
that carries batches from worker processes to the main process (``batch_arena``)."""
