"""``python -m tkc``: the ``tkc`` command, e.g. under ``torchrun --nproc-per-node 2 -m tkc run FILE``."""

from tkc.cli import main

main()
