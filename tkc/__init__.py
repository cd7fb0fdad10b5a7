"""tkc: a compiler from a small tile language to GPU kernels."""
__version__ = "0.1.0"
