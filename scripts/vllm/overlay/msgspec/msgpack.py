"""msgspec.msgpack stand-in: constructible Encoder/Decoder; encoding is not supported."""


class Encoder:
    def __init__(self, *a, **k):
        pass

    def encode(self, obj):
        raise NotImplementedError("msgspec stand-in: msgpack encoding is not available")

    encode_into = encode


class Decoder:
    def __init__(self, *a, **k):
        pass

    def decode(self, buf):
        raise NotImplementedError("msgspec stand-in: msgpack decoding is not available")


class Ext:
    def __init__(self, code, data):
        self.code, self.data = code, data


def encode(obj, *a, **k):
    return Encoder().encode(obj)


def decode(buf, *a, **k):
    return Decoder().decode(buf)
