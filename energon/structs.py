"""``edataclass``: the one dataclass flavour used for samples, batches and config structs.

Every field is keyword-only, so a subclass may add required fields after a base class with
defaults (``Sample`` has defaulted fields), and ``__slots__`` keeps per-sample objects small
and attribute access fast on the hot path.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar, overload

try:
    from typing import dataclass_transform
except ImportError:  # Python 3.10: the decorator only informs type checkers
    try:
        from typing_extensions import dataclass_transform
    except ImportError:

        def dataclass_transform(**_options: Any) -> Callable[[Any], Any]:
            return lambda decorated: decorated


__all__ = ["edataclass"]

T = TypeVar("T", bound=type)


@overload
def edataclass(cls: T) -> T: ...


@overload
def edataclass(cls: None = None, **dataclass_kwargs: Any) -> Callable[[T], T]: ...


@dataclass_transform(kw_only_default=True)
def edataclass(cls: T | None = None, **dataclass_kwargs: Any) -> T | Callable[[T], T]:
    """``dataclass(kw_only=True, slots=True)``; usable bare (``@edataclass``) or with extra
    dataclass options (``@edataclass(frozen=True)``), which may also override the two defaults.

    Note for authors of slotted classes: methods must call ``super(Cls, self)`` explicitly,
    because ``slots=True`` recreates the class and breaks the zero-argument ``super()``.
    """
    options = {"kw_only": True, "slots": True, **dataclass_kwargs}

    def wrap(klass: T) -> T:
        return dataclasses.dataclass(**options)(klass)

    if cls is None:
        return wrap
    return wrap(cls)
