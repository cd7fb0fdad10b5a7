"""What ptxas takes of Blackwell's block-scaled products (docs/block_scaled.md): the minimal
kernels in tests/blackwell/block_scaled/ (MXFP8 ``kind::mxf8f6f4`` with ``scale_vec::1X``, MXFP4
``kind::mxf4`` with 2X, NVFP4 ``kind::mxf4nvf4`` with 4X and ``.block16``; scales copied into
tensor memory by ``tcgen05.cp .32x128b.warpx4``) assemble for sm_100a, and the combinations the
facts say ptxas refuses are refused, in its words.  These are the facts a lowering of
``dot_scaled`` stands on; none has run on a Blackwell GPU."""

from __future__ import annotations

import pathlib

import pytest

from device_checks import needs_ptxas
from tkc.codegen.ptxas import assemble
from tkc.errors import TkcCodegenError

HERE = pathlib.Path(__file__).resolve().parent / "block_scaled"
MXFP8 = (HERE / "mxf8f6f4_1x.ptx").read_text()
PRODUCT = "tcgen05.mma.cta_group::1.kind::mxf8f6f4.block_scale.scale_vec::1X"


@needs_ptxas
@pytest.mark.parametrize("name", sorted(p.name for p in HERE.glob("*.ptx")))
def test_block_scaled_products_assemble(name: str) -> None:
    ptx = (HERE / name).read_text()
    assert "tcgen05.mma" in ptx and ".block_scale" in ptx and "tcgen05.cp.cta_group::1.32x128b.warpx4" in ptx
    assert assemble(ptx, "sm_100a").kernels


@needs_ptxas
@pytest.mark.parametrize("spelling, message", [
    ("tcgen05.mma.cta_group::1.kind::mxf8f6f4.block_scale.scale_vec::2X",
     "'.kind::mxf8f6f4' cannot be combined with modifier '.scale_vec::2X'"),
    ("tcgen05.mma.cta_group::1.kind::mxf8f6f4.scale_vec::1X", ".block_scale modifier required"),
    ("tcgen05.mma.cta_group::1.kind::mxf4.block_scale.scale_vec::1X",
     "'.kind::mxf4' cannot be combined with modifier '.scale_vec::1X'"),
])
def test_block_scaled_spellings_ptxas_refuses(spelling: str, message: str) -> None:
    assert PRODUCT in MXFP8
    with pytest.raises(TkcCodegenError, match=message.replace(".", r"\.").replace("(", r"\(")):
        assemble(MXFP8.replace(PRODUCT, spelling), "sm_100a")
