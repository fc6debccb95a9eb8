"""pydantic.fields stand-in (see pydantic/__init__.py of this overlay)."""
import dataclasses

_UNSET = dataclasses.MISSING


class FieldInfo:
    def __init__(self, default=_UNSET, *, default_factory=None, init=None,
                 ge=None, gt=None, le=None, lt=None, **extra):
        self.default = default
        self.default_factory = default_factory
        self.init = init
        self.bounds = dict(ge=ge, gt=gt, le=le, lt=lt)
        self.extra = extra

    def to_dataclass_field(self):
        kw = {}
        if self.default_factory is not None:
            kw["default_factory"] = self.default_factory
        elif self.default is not _UNSET:
            kw["default"] = self.default
        if self.init is not None:
            kw["init"] = self.init
        return dataclasses.field(**kw)


def Field(default=_UNSET, **kwargs):  # noqa: N802 (pydantic's name)
    if default is Ellipsis:
        default = _UNSET
    return FieldInfo(default, **kwargs)
