# Stub package (real one imports quantization kernels).
