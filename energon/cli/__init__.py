"""The ``energon`` command line: one module per verb, registered in :mod:`energon.cli.main`."""
