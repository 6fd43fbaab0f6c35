"""Resolving ``{__module__, __class__ | __function__}`` references from YAML without running
arbitrary code.

A YAML file (``dataset.yaml``, a metadataset's ``joiner``) may come with a downloaded dataset, so it
must not be able to name ``os.system``, ``subprocess.Popen`` or ``builtins.exec``. Every reference,
class or function, goes through one allow-list:

- energon's public API (``energon.<name>``; ``megatron.energon`` is a synonym);
- the user's own code that the process has already imported (``__main__``, or a module whose file
  lies outside the standard library and the installed packages), e.g. the training script's custom
  sample type or joiner;
- modules listed in the ``ENERGON_ALLOWED_MODULES`` environment variable (comma-separated
  prefixes), imported on demand: the way to allow an installed package.

The object itself must be defined in an allowed module (a user module that merely re-exports
``os.system`` does not make it allowed), and a function must be a plain Python function.
"""

from __future__ import annotations

import importlib
import os
import site
import sys
import sysconfig
import types
from functools import cache
from typing import Any

import energon

ENERGON_MODULE_ALIASES = ("megatron.energon", "energon")


def _energon_namespace() -> Any:
    return energon


def _allowed_by_env(module: str) -> bool:
    allowed = [
        m.strip() for m in os.environ.get("ENERGON_ALLOWED_MODULES", "").split(",") if m.strip()
    ]
    return any(module == a or module.startswith(a + ".") for a in allowed)


def _is_energon(module: str) -> bool:
    return module in ENERGON_MODULE_ALIASES or module.startswith(("megatron.energon.", "energon."))


@cache
def _library_dirs() -> tuple[str, ...]:
    """Folders of the standard library and of installed packages (not the user's own code)."""
    paths = sysconfig.get_paths()
    dirs = {paths.get(name) for name in ("stdlib", "platstdlib", "purelib", "platlib")}
    dirs.update(site.getsitepackages() if hasattr(site, "getsitepackages") else ())
    dirs.add(site.getusersitepackages() if hasattr(site, "getusersitepackages") else None)
    return tuple(os.path.realpath(d) + os.sep for d in dirs if d)


def is_user_module(module: str) -> bool:
    """An imported module of the user's own code: ``__main__``, or one whose source file lies
    outside the standard library and the installed packages."""
    if module == "__main__":
        return True
    mod = sys.modules.get(module)
    if mod is None:
        return False
    top = module.partition(".")[0]
    if top in sys.stdlib_module_names or top in sys.builtin_module_names:
        return False
    path = getattr(mod, "__file__", None)
    if not path:
        return False  # built-in, frozen or namespace module
    return not os.path.realpath(path).startswith(_library_dirs())


def _module_allowed(module: str) -> bool:
    return _is_energon(module) or _allowed_by_env(module) or is_user_module(module)


def resolve_class(module: str, name: str, *, where: str = "", function: bool = False) -> Any:
    """The class (``function=True``: the plain Python function) ``module.name`` under the rules
    above; a clear ``ValueError`` otherwise."""
    origin = f" (in {where})" if where else ""
    what = "function" if function else "class"
    if not isinstance(module, str) or not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"invalid {what} reference {module!r}.{name!r}{origin}")
    if _is_energon(module):
        if name not in energon.__all__ or name.startswith("_"):
            raise ValueError(f"energon has no public {what} named {name!r}{origin}")
        obj = getattr(_energon_namespace(), name)
    else:
        obj = getattr(_import_allowed(module, origin), name, None)
        if obj is None:
            raise ValueError(f"Module {module!r} has no attribute {name!r}{origin}")
    _check_kind(obj, f"{module}.{name}", what, origin)
    return obj


def _import_allowed(module: str, origin: str) -> types.ModuleType:
    if _allowed_by_env(module):
        return importlib.import_module(module)
    if is_user_module(module):
        return sys.modules[module]
    if module in sys.modules:
        raise ValueError(
            f"Refusing to use module {module!r} named in YAML{origin}: it is part of the standard "
            "library or an installed package, not your own code; allow it with "
            f"ENERGON_ALLOWED_MODULES={module} if you trust it"
        )
    raise ValueError(
        f"Refusing to import module {module!r} named in YAML{origin}: import it in your program "
        f"before loading the dataset, or allow it with ENERGON_ALLOWED_MODULES={module}"
    )


def _check_kind(obj: Any, dotted: str, what: str, origin: str) -> None:
    """A class, or a plain Python function, defined in an allowed module."""
    if what == "class" and not isinstance(obj, type):
        raise ValueError(f"{dotted}{origin} is not a class")
    if what == "function" and not isinstance(obj, type | types.FunctionType):
        raise ValueError(f"{dotted}{origin} is not a Python function or class")
    home = getattr(obj, "__module__", None)
    if not isinstance(home, str) or not _module_allowed(home):
        raise ValueError(
            f"Refusing {dotted}{origin}: it is defined in {home!r}, which is not energon or your "
            f"own code (allow it with ENERGON_ALLOWED_MODULES={home})"
        )
