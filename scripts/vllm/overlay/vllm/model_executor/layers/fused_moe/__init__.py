# Stub package: real fused_moe/__init__ needs tensor/data-parallel groups and MoE kernels.
