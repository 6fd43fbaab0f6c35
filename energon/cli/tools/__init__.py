"""``megatron.energon.tools``: the reference's module paths of the ``energon`` verbs. Each module
serves the verb's click ``command`` (the same object as ``energon.cli.<verb>.command``) plus the
names scripts import from the reference's module of that verb."""
