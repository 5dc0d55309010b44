"""Random-weight checkpoints in the exact official layouts, for tests, CI and benchmarks.

``dit`` writes DiT experts (NF4 layout A or bf16 layout B), ``t5`` the umT5 encoder (the
official .pth, ComfyUI's umt5_xxl .safetensors) and a small tokenizer, ``vae`` the Wan2.1
VAE. The pack's own loaders read what they write unchanged; ``tools/make_checkpoint.py``
puts them together into a package folder.
"""
