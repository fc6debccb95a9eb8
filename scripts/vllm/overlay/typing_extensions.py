"""Shim over Debian's typing_extensions 4.4: re-exports it and adds `deprecated`
(typing_extensions >= 4.5, used by vllm/v1/attention/backend.py), as PEP 702 defines it:
marks the object, warns on use of a deprecated class/function."""
import functools as _functools
import importlib.machinery as _mach
import importlib.util as _util
import os as _os
import sys as _sys
import warnings as _warnings

_here = _os.path.dirname(_os.path.abspath(__file__))
_spec = _mach.PathFinder.find_spec(
    "typing_extensions", [p for p in _sys.path if _os.path.abspath(p or ".") != _here])
_real = _util.module_from_spec(_spec)
_spec.loader.exec_module(_real)
globals().update({k: v for k, v in vars(_real).items() if not k.startswith("__")})

if not hasattr(_real, "deprecated"):
    class deprecated:  # noqa: N801 (PEP 702 name)
        def __init__(self, message, /, *, category=DeprecationWarning, stacklevel=1):
            self.message, self.category, self.stacklevel = message, category, stacklevel

        def __call__(self, arg):
            msg, cat, lvl = self.message, self.category, self.stacklevel
            arg.__deprecated__ = msg
            if isinstance(arg, type) or cat is None:
                return arg

            @_functools.wraps(arg)
            def wrapper(*a, **k):
                _warnings.warn(msg, category=cat, stacklevel=lvl + 1)
                return arg(*a, **k)
            wrapper.__deprecated__ = msg
            return wrapper
