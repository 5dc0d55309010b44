"""How the model runs, beside what it computes (``wan/`` holds the model math): attention
backends, fused Triton kernels, dense weights per block, block swap and LoRA adapters."""
