"""Who runs a rank's logical streams besides the main process: the contract of a worker pool
(``base``), the messages workers send (``messages``), forked worker processes (``processes``) and
the in-order reader of their results that replaces lost workers (``results``)."""
