"""``megatron.energon.fork_hook``: run functions around ``os.fork`` (e.g. to reopen files or
connections in a forked worker), held weakly unless made persistent."""

from __future__ import annotations

import dataclasses
import os
import weakref
from collections.abc import Callable
from typing import Any

__all__ = [
    "DataclassForkMixin",
    "ForkMixin",
    "WeakCallbacks",
    "after_in_child_fork_hook",
    "after_in_parent_fork_hook",
    "before_fork_hook",
]


class WeakCallbacks:
    """Callbacks held by weak reference (bound methods included), or strongly when persistent."""

    def __init__(self) -> None:
        self._weak: list[Any] = []
        self._strong: list[Callable[..., Any]] = []

    def add_hook(self, callable: Callable[..., Any], make_persistent: bool = False) -> None:  # noqa: A002
        if make_persistent:
            self._strong.append(callable)
        elif hasattr(callable, "__self__") and hasattr(callable, "__func__"):
            self._weak.append(weakref.WeakMethod(callable))
        else:
            self._weak.append(weakref.ref(callable))

    def run(self, *args: Any, **kwargs: Any) -> None:
        alive = []
        for ref in self._weak:
            fn = ref()
            if fn is not None:
                alive.append(ref)
                fn(*args, **kwargs)
        self._weak = alive
        for fn in self._strong:
            fn(*args, **kwargs)


_before = WeakCallbacks()
_after_child = WeakCallbacks()
_after_parent = WeakCallbacks()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(
        before=_before.run, after_in_child=_after_child.run, after_in_parent=_after_parent.run
    )


def before_fork_hook(callable: Callable[[], None], make_persistent: bool = False) -> None:  # noqa: A002
    """Run ``callable`` in the parent just before every fork."""
    _before.add_hook(callable, make_persistent)


def after_in_child_fork_hook(callable: Callable[[], None], make_persistent: bool = False) -> None:  # noqa: A002
    """Run ``callable`` in the child right after every fork."""
    _after_child.add_hook(callable, make_persistent)


def after_in_parent_fork_hook(callable: Callable[[], None], make_persistent: bool = False) -> None:  # noqa: A002
    """Run ``callable`` in the parent right after every fork."""
    _after_parent.add_hook(callable, make_persistent)


class _ForkMethods:
    def __before_fork__(self) -> None:
        """Runs in the parent before a fork."""

    def __after_in_child_fork__(self) -> None:
        """Runs in the child after a fork."""

    def __after_in_parent_fork__(self) -> None:
        """Runs in the parent after a fork."""


class ForkMixin(_ForkMethods):
    """``__before_fork__`` / ``__after_in_child_fork__`` / ``__after_in_parent_fork__`` run
    around every fork while the object lives."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.__post_init__()

    def __post_init__(self) -> None:
        _register_methods(self)


@dataclasses.dataclass
class DataclassForkMixin(_ForkMethods):
    """``ForkMixin`` for dataclasses (registered in ``__post_init__``)."""

    def __post_init__(self) -> None:
        _register_methods(self)


def _register_methods(obj: Any) -> None:
    _before.add_hook(obj.__before_fork__)
    _after_child.add_hook(obj.__after_in_child_fork__)
    _after_parent.add_hook(obj.__after_in_parent_fork__)
