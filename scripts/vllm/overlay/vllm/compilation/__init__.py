# Stub: real vllm.compilation is torch.compile / inductor / CUDA-graph machinery (torch>=2).
