# Stub: real quant_utils builds QuantKey constants from current_platform.fp8_dtype()
# (torch.float8_e4m3fn, torch >= 2.1).  The attention backend base class (imported by
# the KV-connector base) only compares against these keys: named sentinels stand in.
class QuantKey:
    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return f"QuantKey({self.name})"


kFp8StaticTensorSym = QuantKey("fp8_static_tensor_sym")
kFp8Dynamic128Sym = QuantKey("fp8_dynamic_128_sym")
kFp8Dynamic64Sym = QuantKey("fp8_dynamic_64_sym")
kNvfp4Dynamic = QuantKey("nvfp4_dynamic")
