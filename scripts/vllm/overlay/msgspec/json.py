"""msgspec.json stand-in backed by the stdlib json module (builtins and Structs)."""
import json as _json


def encode(obj, *a, **k):
    from msgspec import to_builtins
    return _json.dumps(to_builtins(obj)).encode()


def decode(buf, *a, type=None, **k):  # noqa: A002
    return _json.loads(buf)


class Encoder:
    def __init__(self, *a, **k):
        pass

    def encode(self, obj):
        return encode(obj)


class Decoder:
    def __init__(self, *a, type=None, **k):  # noqa: A002
        pass

    def decode(self, buf):
        return decode(buf)
