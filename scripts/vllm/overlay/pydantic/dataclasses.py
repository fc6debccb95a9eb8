"""pydantic.dataclasses stand-in: stdlib dataclass + validators (see __init__.py)."""
import dataclasses as _dc
import functools
import inspect

from pydantic.fields import FieldInfo
from pydantic.main import _Marker, ValidationError


def _call_field_validator(cls, marker, value, name):
    # pydantic treats a plain function validator as a classmethod (first arg = cls)
    func = marker.func.__func__ if isinstance(marker.func, (classmethod, staticmethod)) \
        else marker.func
    params = list(inspect.signature(func).parameters)
    if isinstance(marker.func, staticmethod):
        fn = func
    else:
        fn = functools.partial(func, cls)
        params = params[1:]
    if marker.mode == "wrap":
        handler = lambda v, *a: v  # noqa: E731
        return fn(value, handler) if len(params) <= 2 else fn(value, handler, None)
    return fn(value) if len(params) <= 1 else fn(value, None)


def _check_bounds(name, value, bounds):
    if value is None or not isinstance(value, (int, float)):
        return
    ge, gt, le, lt = bounds["ge"], bounds["gt"], bounds["le"], bounds["lt"]
    if (ge is not None and value < ge) or (gt is not None and value <= gt) or \
            (le is not None and value > le) or (lt is not None and value >= lt):
        raise ValidationError(f"{name}={value!r} violates bounds "
                              f"{ {k: v for k, v in bounds.items() if v is not None} }")


def dataclass(cls=None, *, config=None, **kwargs):
    def wrap(cls):
        bounds = {}
        field_markers, model_markers = [], []
        for k, v in list(cls.__dict__.items()):
            if isinstance(v, FieldInfo):
                bounds[k] = v.bounds
                setattr(cls, k, v.to_dataclass_field())
            elif isinstance(v, _Marker):
                (field_markers if v.kind == "field" else model_markers).append(v)
                setattr(cls, k, v.func)
        for base in cls.__mro__[1:]:
            field_markers += getattr(base, "__shim_field_validators__", [])
            model_markers += getattr(base, "__shim_model_validators__", [])
            for k, b in getattr(base, "__shim_bounds__", {}).items():
                bounds.setdefault(k, b)
        cls.__shim_field_validators__ = field_markers
        cls.__shim_model_validators__ = model_markers
        cls.__shim_bounds__ = bounds
        orig_post = cls.__dict__.get("__post_init__")
        inherited_post = None if orig_post else getattr(cls, "__post_init__", None)
        dc_kwargs = {k: v for k, v in kwargs.items()
                     if k in ("init", "repr", "eq", "order", "unsafe_hash", "frozen",
                              "kw_only", "slots", "match_args")}

        def __post_init__(self, *initvars):
            names = {f.name for f in _dc.fields(type(self))}
            for m in field_markers:
                if m.mode in ("before", "plain", "wrap", "after"):
                    targets = names if "*" in m.fields else m.fields
                    for fname in targets:
                        if fname in names and hasattr(self, fname):
                            setattr(self, fname, _call_field_validator(
                                type(self), m, getattr(self, fname), fname))
            for fname, b in bounds.items():
                if hasattr(self, fname):
                    _check_bounds(f"{type(self).__name__}.{fname}",
                                  getattr(self, fname), b)
            post = orig_post or inherited_post
            if post is not None:
                post(self, *initvars)

        cls.__post_init__ = __post_init__
        cls = _dc.dataclass(cls, **dc_kwargs)
        orig_init = cls.__init__

        @functools.wraps(orig_init)
        def __init__(self, *a, **k):
            orig_init(self, *a, **k)
            for m in model_markers:
                if m.mode == "after":
                    m.func(self)

        cls.__init__ = __init__
        cls.__pydantic_config__ = config or {}
        return cls

    return wrap if cls is None else wrap(cls)


is_pydantic_dataclass = _dc.is_dataclass
