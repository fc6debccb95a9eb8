"""Stand-in for pydantic v2 (Debian bookworm ships only pydantic 1.10; vLLM's config
classes are pydantic-v2 dataclasses).  Just enough API for vllm/config/{utils,cache,
scheduler,kv_transfer,ec_transfer,kv_events}.py to import and behave: `@dataclass` is a
stdlib dataclass that also runs the class's field/model validators and Field(ge/gt/le/lt)
bounds, in pydantic's order (field validators, __post_init__, model 'after' validators).
No type coercion is done (values are taken as given)."""
from pydantic.fields import Field, FieldInfo  # noqa: F401
from pydantic.main import (  # noqa: F401
    ConfigDict,
    SkipValidation,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)

VERSION = "2.0-hybridkv-shim"
