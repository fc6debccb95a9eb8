"""safetensors.torch stand-in (see safetensors/__init__.py of this overlay)."""


def _unavailable(*a, **k):
    raise NotImplementedError("safetensors is not available on this machine")


save_file = load_file = save = load = safe_open = _unavailable
