"""Checks of the public functions' arguments: a bad argument is an :class:`ArgumentError` that
names it and says what was expected, raised before anything runs (not a ``min() arg is an empty
sequence`` from deep inside, or a silently empty result).

The ``energon`` command line maps the names back to its options (``from_step`` is
``--from-step``), so one check serves the Python API and the command alike.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import operator
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from energon.errors import ArgumentError, ArgumentTypeError

F = TypeVar("F", bound=Callable[..., Any])


def integer(
    value: Any, name: str, *, low: int | None = None, high: int | None = None, none: bool = False
) -> int | None:
    """``value`` as an int in ``[low, high]`` (None allowed when ``none``). Anything that is an
    integer (numpy's too) passes; bools and floats do not."""
    if value is None and none:
        return None
    if isinstance(value, bool):
        raise ArgumentTypeError(name, f"expected {_integer_text(low, high, none)}, got {value!r}")
    try:
        number = operator.index(value)
    except TypeError:
        raise ArgumentTypeError(
            name, f"expected {_integer_text(low, high, none)}, got {value!r}"
        ) from None
    if (low is not None and number < low) or (high is not None and number > high):
        raise ArgumentError(name, f"expected {_integer_text(low, high, none)}, got {number}")
    return number


def _integer_text(low: int | None, high: int | None, none: bool) -> str:
    if low is not None and high is not None:
        text = f"an integer in [{low}, {high}]"
    elif low is not None:
        text = f"an integer >= {low}"
    elif high is not None:
        text = f"an integer <= {high}"
    else:
        text = "an integer"
    return text + (" or None" if none else "")


def instance(value: Any, name: str, kind: type | tuple[type, ...], expected: str) -> Any:
    """``value`` if it is a ``kind``; else an :class:`ArgumentTypeError` saying ``expected``."""
    if not isinstance(value, kind):
        raise ArgumentTypeError(name, f"expected {expected}, got {_described(value)}")
    return value


def not_empty(values: Sequence[Any], name: str, expected: str) -> Sequence[Any]:
    if isinstance(values, str | bytes) or not isinstance(values, Sequence):
        raise ArgumentTypeError(name, f"expected {expected}, got {_described(values)}")
    if not values:
        raise ArgumentError(name, f"expected {expected}, got none")
    return values


def step_span(first: Any, until: Any, names: tuple[str, str]) -> range:
    """Steps ``first`` to ``until - 1``: both integers >= 0, ``first`` < ``until`` (an empty or
    reversed span is an error that says so, not an empty answer)."""
    start = integer(first, names[0], low=0)
    stop = integer(until, names[1], low=0)
    assert start is not None and stop is not None
    if start == stop:
        raise ArgumentError(
            f"{names[0]}/{names[1]}",
            f"{start}..{stop - 1} is an empty range (steps {names[0]} to {names[1]} - 1)",
        )
    if start > stop:
        raise ArgumentError(
            f"{names[0]}/{names[1]}",
            f"{names[0]} {start} is after {names[1]} {stop} (steps {names[0]} to {names[1]} - 1)",
        )
    return range(start, stop)


def _described(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"


def known_keywords(*also: str) -> Callable[[F], F]:
    """Decorator: a keyword the function does not name (nor lists in ``also``, the keywords its
    ``**kwargs`` takes) is an :class:`ArgumentTypeError` that names the closest valid keyword, so
    a typo such as ``shuffle_buffer=`` fails at the call, saying ``shuffle_buffer_size``. The
    signature stays the function's own (``inspect.signature`` sees through the wrapper)."""

    def decorate(function: F) -> F:
        parameters = inspect.signature(function).parameters.values()
        named = [p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        valid = frozenset(named) | frozenset(also)

        @functools.wraps(function)
        def checked(*args: Any, **kwargs: Any) -> Any:
            unknown = [name for name in kwargs if name not in valid]
            if unknown:
                raise unknown_keywords(function.__name__, unknown, sorted(valid))
            return function(*args, **kwargs)

        return checked  # type: ignore[return-value]

    return decorate


def unknown_keywords(
    function: str, unknown: Sequence[str], valid: Sequence[str]
) -> ArgumentTypeError:
    """The error for keywords ``function`` does not take, each with its closest valid one (all
    valid keywords when none is close)."""
    hints = []
    for name in unknown:
        close = difflib.get_close_matches(name, valid, n=1, cutoff=0.6)
        hints.append(
            f"{name!r}: did you mean {close[0]!r}?"
            if close
            else f"{name!r}: none is close; the keywords are {', '.join(valid)}"
        )
    return ArgumentTypeError(
        ", ".join(unknown), f"not a keyword of {function}() ({'; '.join(hints)})"
    )
