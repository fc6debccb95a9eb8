# Un-stub (mostly): vLLM's own StructuredOutputManager, run unmodified except the imports
# of grammar backends (xgrammar / llguidance), reasoning parsers and HF tokenizers, which
# are not installable here.  Their stand-ins raise NotImplementedError when actually used
# (i.e. only by requests with structured outputs / reasoning parsers); the tokenizer
# "loaded" at construction is a placeholder that raises on first use.
from vllm._real import exec_real_dropping_imports


class _NoTokenizer:
    """Placeholder for an HF tokenizer (transformers is not available)."""

    def __init__(self, name):
        self._name = name

    def __getattr__(self, attr):
        raise NotImplementedError(
            f"tokenizer {self._name!r} unavailable (no transformers); needed .{attr}")


def cached_tokenizer_from_config(model_config, **kw):  # vllm.tokenizers stand-in
    return _NoTokenizer(getattr(model_config, "tokenizer", None))


class ReasoningParserManager:  # vllm.reasoning stand-in
    @classmethod
    def get_reasoning_parser(cls, name):
        raise NotImplementedError(f"reasoning parser {name!r} unavailable here")

    @classmethod
    def import_reasoning_parser(cls, path):
        raise NotImplementedError("reasoning parser plugins unavailable here")


class _UnavailableBackend:
    def __init__(self, *a, **k):
        raise NotImplementedError(
            f"{type(self).__name__}: grammar backend not installable here")


class XgrammarBackend(_UnavailableBackend):
    pass


class GuidanceBackend(_UnavailableBackend):
    pass


exec_real_dropping_imports(
    "v1/structured_output/__init__.py", globals(),
    {"vllm.reasoning", "vllm.tokenizers", "vllm.v1.structured_output.backend_guidance",
     "vllm.v1.structured_output.backend_xgrammar"})
