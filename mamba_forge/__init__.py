"""mamba-forge: build, qualify, sign and load deterministic Mamba SSM CUDA kernels."""

__version__ = "0.1.0"
