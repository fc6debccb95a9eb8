# Stub: the real module captures MoE routing on the GPU (tp group, forward context).
# The scheduler builds a RoutedExpertsManager only with enable_return_routed_experts.
class RoutedExpertsManager:
    def __init__(self, *a, **k):
        raise NotImplementedError("routed-experts capture needs the GPU model runner")
