"""``megatron.energon.deprecation``: deprecation warnings (``FutureWarning``, as the reference)."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["deprecated", "warn_deprecated"]

F = TypeVar("F", bound=Callable[..., Any])


def warn_deprecated(reason: str, stacklevel: int = 2) -> None:
    warnings.warn(reason, FutureWarning, stacklevel=stacklevel + 1)


def deprecated(reason: str) -> Callable[[F], F]:
    """Decorator: calling the function warns ``"<name> is deprecated: <reason>"``."""

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            warn_deprecated(f"{fn.__name__} is deprecated: {reason}", stacklevel=2)
            return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return decorate
