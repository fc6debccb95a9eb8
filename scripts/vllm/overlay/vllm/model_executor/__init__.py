# Stub: real vllm/model_executor/__init__.py imports parameter/weight classes that need
# tensor-parallel state; submodules still load from vLLM (layered finder).
