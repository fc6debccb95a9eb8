# Stub: real MultiModalBudget profiles multimodal processors (transformers); only built
# by the scheduler for multimodal models, which cannot run here.
class MultiModalBudget:
    def __init__(self, *a, **k):
        raise NotImplementedError("multimodal encoder budget needs HF processors")
