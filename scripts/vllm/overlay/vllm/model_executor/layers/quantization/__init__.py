# Stub: real package __init__ registers every quantization method (imports
# transformers); the attention backend only needs utils/quant_utils constants.
