"""msgspec.structs stand-in (see msgspec/__init__.py of this overlay)."""
import dataclasses as _dc


def replace(obj, **changes):
    return _dc.replace(obj, **changes)


def asdict(obj):
    return {f.name: getattr(obj, f.name) for f in _dc.fields(obj)}


def astuple(obj):
    return tuple(getattr(obj, f.name) for f in _dc.fields(obj))


def fields(obj_or_type):
    return _dc.fields(obj_or_type)


def force_setattr(obj, name, value):
    object.__setattr__(obj, name, value)
