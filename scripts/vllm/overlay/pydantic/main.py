"""Validator markers and small types of the pydantic stand-in."""
import typing


class ValidationError(ValueError):
    pass


class ConfigDict(dict):
    """pydantic.ConfigDict is a TypedDict; a dict subclass keeps `ConfigDict | None` legal."""


class _SkipValidation:
    def __getitem__(self, item):
        return item


SkipValidation = _SkipValidation()


class TypeAdapter:
    def __init__(self, tp, *a, **k):
        self.tp = tp

    def validate_python(self, value, *a, **k):
        return value


class _Marker:
    """Wraps a validator function (or classmethod) until @dataclass collects it."""

    def __init__(self, kind, func, fields=(), mode="after"):
        self.kind, self.func, self.fields, self.mode = kind, func, fields, mode


def field_validator(*fields, mode="after", **_):
    def deco(func):
        return _Marker("field", func, fields, mode)
    return deco


def model_validator(*, mode="after"):
    def deco(func):
        return _Marker("model", func, (), mode)
    return deco


Any = typing.Any
