"""Stand-in for msgspec (not packaged by Debian bookworm).  `Struct` subclasses become
stdlib dataclasses with the same field order, defaults, positional/keyword init,
__post_init__, equality and kw_only/frozen options (empty list/dict/set defaults are
copied per instance, as msgspec does).  Serialisation (msgpack/json encoders) is not
implemented: nothing in the scheduler / KV-cache path serialises in-process."""
import dataclasses as _dc
import sys as _sys

from msgspec import structs  # noqa: F401


class _UnsetType:
    _inst = None

    def __new__(cls):
        if cls._inst is None:
            cls._inst = super().__new__(cls)
        return cls._inst

    def __repr__(self):
        return "UNSET"

    def __bool__(self):
        return False


UNSET = _UnsetType()
UnsetType = _UnsetType
NODEFAULT = _dc.MISSING


def field(*, default=_dc.MISSING, default_factory=_dc.MISSING, name=None):
    return _dc.field(default=default, default_factory=default_factory)


class Meta:
    def __init__(self, *a, **k):
        self.args, self.kwargs = a, k


_DC_OPTS = ("kw_only", "frozen")


class Struct:
    __struct_fields__: tuple = ()
    __struct_config__: dict = {}

    def __init_subclass__(cls, **opts):
        super().__init_subclass__()
        inherited = dict(getattr(cls, "__struct_config__", {}))
        frozen = opts.get("frozen", inherited.get("frozen", False))
        kw_only = opts.get("kw_only", False)
        cfg = dict(inherited, **{k: v for k, v in opts.items() if k != "kw_only"})
        ann = cls.__dict__.get("__annotations__", {})
        for name in ann:
            if name in cls.__dict__:
                v = cls.__dict__[name]
                if isinstance(v, (list, dict, set)) and not v:
                    setattr(cls, name, _dc.field(default_factory=type(v)))
        dc = _dc.dataclass(cls, frozen=frozen, kw_only=kw_only, repr=True, eq=True)
        assert dc is cls
        cls.__struct_config__ = cfg
        cls.__struct_fields__ = tuple(f.name for f in _dc.fields(cls))


class ValidationError(ValueError):
    pass


class DecodeError(ValueError):
    pass


class EncodeError(ValueError):
    pass


class Raw(bytes):
    pass


def to_builtins(obj, *a, **k):
    if _dc.is_dataclass(obj):
        return {f.name: to_builtins(getattr(obj, f.name)) for f in _dc.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_builtins(x) for x in obj]
    if isinstance(obj, dict):
        return {k2: to_builtins(v) for k2, v in obj.items()}
    return obj


def convert(obj, type=None, *a, **k):  # noqa: A002
    return obj


from msgspec import json, msgpack  # noqa: E402,F401

_sys.modules.setdefault("msgspec.json", json)
_sys.modules.setdefault("msgspec.msgpack", msgpack)
