"""The runtime: the only part of tkc that touches the CUDA driver and torch."""
