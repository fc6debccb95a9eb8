# Stub: real vllm.multimodal builds processors from HF processors (transformers, PIL).
# Text-only registry: supports_multimodal_inputs() is False for non-multimodal models,
# as in the real MultiModalRegistry; multimodal models cannot be run here.
class MultiModalRegistry:
    def supports_multimodal_inputs(self, model_config) -> bool:
        if not getattr(model_config, "is_multimodal_model", False):
            return False
        raise NotImplementedError("multimodal processors need transformers")


MULTIMODAL_REGISTRY = MultiModalRegistry()
