"""The runtime on a real GPU: PTX/cubin loading, JIT logs, launches, clusters and TMA.

Run on a Hopper machine with ``python -m pytest -m gpu tests/runtime -q``.  Without a CUDA
GPU every test here is skipped.  The PTX is hand-written (sm_90a, PTX 8.0) so that these
tests check the runtime alone, not the code generator.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)"),
]

from tkc.dtypes import bf16  # noqa: E402
from tkc.errors import TkcLaunchError  # noqa: E402
from tkc.ir.layouts import SharedLayout  # noqa: E402
from tkc.runtime import driver, tensormap  # noqa: E402
from tkc.runtime.driver import Module  # noqa: E402

AXPB = r"""
.version 8.0
.target sm_90a
.address_size 64

// out[i] = a[i] * s + b[i] for i < n (mul and add rounded separately, like torch's a * s + b)
.visible .entry axpb(
    .param .u64 out,
    .param .u64 a,
    .param .u64 b,
    .param .f32 s,
    .param .u32 n
)
{
    .reg .pred  %p<2>;
    .reg .b32   %r<8>;
    .reg .f32   %f<6>;
    .reg .b64   %rd<12>;

    ld.param.u64    %rd1, [out];
    ld.param.u64    %rd2, [a];
    ld.param.u64    %rd3, [b];
    ld.param.f32    %f1, [s];
    ld.param.u32    %r1, [n];
    mov.u32         %r2, %ctaid.x;
    mov.u32         %r3, %ntid.x;
    mov.u32         %r4, %tid.x;
    mad.lo.s32      %r5, %r2, %r3, %r4;
    setp.ge.u32     %p1, %r5, %r1;
    @%p1 bra        DONE;
    cvta.to.global.u64 %rd4, %rd1;
    cvta.to.global.u64 %rd5, %rd2;
    cvta.to.global.u64 %rd6, %rd3;
    mul.wide.u32    %rd7, %r5, 4;
    add.s64         %rd8, %rd5, %rd7;
    ld.global.f32   %f2, [%rd8];
    add.s64         %rd9, %rd6, %rd7;
    ld.global.f32   %f3, [%rd9];
    mul.rn.f32      %f4, %f2, %f1;
    add.rn.f32      %f5, %f4, %f3;
    add.s64         %rd10, %rd4, %rd7;
    st.global.f32   [%rd10], %f5;
DONE:
    ret;
}

// out[2*cta] = number of CTAs in this CTA's cluster, out[2*cta+1] = rank in the cluster
.visible .entry cluster_info(
    .param .u64 out
)
{
    .reg .pred  %p<2>;
    .reg .b32   %r<6>;
    .reg .b64   %rd<6>;

    mov.u32         %r1, %tid.x;
    setp.ne.u32     %p1, %r1, 0;
    @%p1 bra        DONE;
    ld.param.u64    %rd1, [out];
    cvta.to.global.u64 %rd2, %rd1;
    mov.u32         %r2, %ctaid.x;
    mov.u32         %r3, %cluster_nctarank;
    mov.u32         %r4, %cluster_ctarank;
    mul.wide.u32    %rd3, %r2, 8;
    add.s64         %rd4, %rd2, %rd3;
    st.global.u32   [%rd4], %r3;
    st.global.u32   [%rd4+4], %r4;
DONE:
    ret;
}
"""

# One thread loads one box through the tensor map (TMA, completing on an mbarrier); then the
# 128 threads copy the 8192 bytes of shared memory to `out` verbatim, 16 B per thread per step.
TMA_LOAD = r"""
.version 8.0
.target sm_90a
.address_size 64

.extern .shared .align 1024 .b8 dsmem[];

.visible .entry tma_load(
    .param .align 64 .b8 tmap[128],
    .param .u64 out,
    .param .u32 c0,
    .param .u32 c1
)
.maxntid 128, 1, 1
{
    .reg .pred  %p<4>;
    .reg .b32   %r<16>;
    .reg .b64   %rd<8>;
    .shared .align 8 .b64 bar;

    mov.u32         %r0, %tid.x;
    mov.u64         %rd0, tmap;
    cvta.param.u64  %rd1, %rd0;
    mov.u32         %r1, bar;
    mov.u32         %r2, dsmem;
    add.u32         %r2, %r2, 1023;            // SWIZZLE_128B needs a 1024-B aligned destination:
    and.b32         %r2, %r2, -1024;           // align by hand (the launch adds 1024 B of slack)
    ld.param.u64    %rd2, [out];
    cvta.to.global.u64 %rd3, %rd2;
    ld.param.u32    %r4, [c0];
    ld.param.u32    %r5, [c1];

    setp.ne.u32     %p0, %r0, 0;
    @%p0 bra        SKIP_INIT;
    mbarrier.init.shared::cta.b64 [%r1], 1;
    fence.mbarrier_init.release.cluster;
    fence.proxy.async.shared::cta;
SKIP_INIT:
    bar.sync        0;
    @%p0 bra        WAIT_START;
    mbarrier.arrive.expect_tx.shared::cta.b64 %rd4, [%r1], 8192;
    cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%r2], [%rd1, {%r4, %r5}], [%r1];
WAIT_START:
    mov.u32         %r6, 0;
WAIT:
    mbarrier.try_wait.parity.shared::cta.b64 %p1, [%r1], %r6;
    @!%p1 bra       WAIT;

    mov.u32         %r7, 0;
COPY:
    mad.lo.u32      %r8, %r7, 128, %r0;        // 16-B chunk index
    shl.b32         %r8, %r8, 4;
    add.u32         %r9, %r2, %r8;
    ld.shared.v4.b32 {%r10, %r11, %r12, %r13}, [%r9];
    cvt.u64.u32     %rd5, %r8;
    add.s64         %rd6, %rd3, %rd5;
    st.global.v4.b32 [%rd6], {%r10, %r11, %r12, %r13};
    add.u32         %r7, %r7, 1;
    setp.lt.u32     %p2, %r7, 4;
    @%p2 bra        COPY;
    ret;
}
"""

BAD_PTX = r"""
.version 8.0
.target sm_90a
.address_size 64

.visible .entry broken(.param .u64 out)
{
    .reg .b64 %rd<2>;
    ld.param.u64 %rd1, [out];
    st.global.u32 [%rd1], %r_never_declared;
    ret;
}
"""


def _ptr(t) -> ctypes.c_void_p:
    return ctypes.c_void_p(t.data_ptr())


@pytest.fixture(scope="module")
def axpb_ptx() -> Module:
    return Module.load(AXPB, "ptx")


def _cubin(ptx: str) -> bytes:
    try:
        from tkc.codegen.ptxas import assemble, find_ptxas
    except ImportError as e:  # llvmlite missing on this machine: the codegen package cannot load
        pytest.skip(f"tkc.codegen.ptxas cannot be imported ({e})")
    if find_ptxas() is None:
        pytest.skip("no ptxas found: cubin loading not tested")
    return assemble(ptx, "sm_90a", verbose=False).cubin


def _run_axpb(mod: Module, n: int, s: float = 1.75) -> None:
    g = torch.Generator(device="cuda").manual_seed(n)
    a = torch.randn(n, device="cuda", generator=g)
    b = torch.randn(n, device="cuda", generator=g)
    out = torch.full((n + 64,), float("nan"), device="cuda")  # poisoned, with a tail the kernel must not touch
    block = 128
    mod.function("axpb").launch(grid=(n + block - 1) // block, block=block,
                                params=[_ptr(out), _ptr(a), _ptr(b), ctypes.c_float(s), ctypes.c_uint32(n)])
    torch.cuda.synchronize()
    assert torch.equal(out[:n], a * s + b)
    assert out[n:].isnan().all()


@pytest.mark.parametrize("n", [1, 127, 1000, 4099])
def test_ptx_launch_odd_sizes(axpb_ptx, n):
    _run_axpb(axpb_ptx, n)


def test_cubin_launch():
    mod = Module.load(_cubin(AXPB), "cubin")
    _run_axpb(mod, 777, s=-0.5)


def test_launch_on_a_side_stream(axpb_ptx):
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        assert driver.current_stream() == s.cuda_stream
        _run_axpb(axpb_ptx, 300)


def test_jit_error_surfaces_driver_log():
    with pytest.raises(TkcLaunchError) as e:
        Module.load(BAD_PTX, "ptx")
    msg = str(e.value)
    assert "cuModuleLoadDataEx (ptx" in msg
    assert "CUDA_ERROR_INVALID_PTX" in msg
    log = msg.split("JIT error log:", 1)[1]
    assert "r_never_declared" in log or "error" in log.lower(), msg


def test_unknown_function_is_named(axpb_ptx):
    with pytest.raises(TkcLaunchError, match=r"cuModuleGetFunction\('nope'\) failed: CUDA_ERROR_NOT_FOUND"):
        axpb_ptx.function("nope")


def test_cluster_launch(axpb_ptx):
    out = torch.full((8, 2), -1, dtype=torch.int32, device="cuda")
    axpb_ptx.function("cluster_info").launch(grid=8, block=32, params=[_ptr(out)], cluster=(2, 1, 1))
    torch.cuda.synchronize()
    assert out[:, 0].tolist() == [2] * 8
    assert out[:, 1].tolist() == [0, 1] * 4
    # and the simple kernel still computes the right thing under a cluster launch
    n = 1000
    a = torch.randn(n, device="cuda")
    b = torch.randn(n, device="cuda")
    o = torch.full((n,), float("nan"), device="cuda")
    axpb_ptx.function("axpb").launch(grid=8, block=128, cluster=(2, 1, 1),
                                     params=[_ptr(o), _ptr(a), _ptr(b), ctypes.c_float(3.0), ctypes.c_uint32(n)])
    torch.cuda.synchronize()
    assert torch.equal(o, a * 3.0 + b)


def test_cluster_must_divide_grid(axpb_ptx):
    with pytest.raises(TkcLaunchError, match=r"grid \(3, 1, 1\) is not a multiple of the cluster shape \(2, 1, 1\)"):
        axpb_ptx.function("cluster_info").launch(grid=3, block=32, params=[ctypes.c_void_p(0)], cluster=2)


# ----------------------------------------------------------------------------- TMA
@pytest.fixture(scope="module")
def tma_fn():
    f = Module.load(TMA_LOAD, "ptx").function("tma_load")
    f.set_max_dynamic_shared(8192 + 1024)
    return f


def _tma_box(fn, t, c0: int, c1: int) -> np.ndarray:
    """Load the 64x64 box at (col c0, row c1) of bf16 tensor ``t``; return shared memory's bytes as u16."""
    layout = SharedLayout(64, 64, bf16, "k", 128)
    box = layout.tma_box()
    assert box.dims == (64, 64) and box.count == (1, 1)
    tm = tensormap.encode_tiled(t, box.dims, layout.tma_swizzle_enum(), name="t")
    out = torch.full((8192,), 0x5A, dtype=torch.uint8, device="cuda")
    fn.launch(grid=1, block=128, shared_bytes=8192 + 1024,
              params=[tm, _ptr(out), ctypes.c_uint32(c0), ctypes.c_uint32(c1)])
    torch.cuda.synchronize()
    return out.view(torch.int16).cpu().numpy().view(np.uint16)


def _expected(tile_u16: np.ndarray) -> np.ndarray:
    """Where SharedLayout says each element of the 64x64 tile lives, as a flat u16 image."""
    layout = SharedLayout(64, 64, bf16, "k", 128)
    r, c = np.meshgrid(np.arange(64), np.arange(64), indexing="ij")
    off = layout.offset(r, c)
    assert (off % 2 == 0).all() and sorted(off.ravel().tolist()) == list(range(0, 8192, 2))
    img = np.empty(4096, np.uint16)
    img[off // 2] = tile_u16
    return img


def _random_bf16(rows: int, cols: int, stride: int | None = None):
    """A bf16 tensor of random bit patterns (row stride ``stride`` elements), and its bits."""
    stride = stride or cols
    bits = torch.randint(-(2**15), 2**15, (rows, stride), dtype=torch.int16, device="cuda")
    t = bits.view(torch.bfloat16)[:, :cols]
    return t, bits.cpu().numpy().view(np.uint16)[:, :cols]


def test_tma_swizzle_128b_matches_shared_layout(tma_fn):
    t, bits = _random_bf16(128, 192)
    got = _tma_box(tma_fn, t, 64, 64)
    assert np.array_equal(got, _expected(bits[64:128, 64:128]))
    got = _tma_box(tma_fn, t, 128, 0)
    assert np.array_equal(got, _expected(bits[0:64, 128:192]))


def test_tma_out_of_bounds_zero_fill(tma_fn):
    # 100 x 70 with a padded row (72 elements = 144 B, a multiple of 16): the padding holds
    # random bits too, so a fill that read past the logical width would show.
    t, bits = _random_bf16(100, 70, stride=72)
    assert t.shape == (100, 70) and t.stride() == (72, 1)
    tile = np.zeros((64, 64), np.uint16)
    tile[: 100 - 64, : 70 - 64] = bits[64:100, 64:70]
    got = _tma_box(tma_fn, t, 64, 64)
    assert np.array_equal(got, _expected(tile))
    got = _tma_box(tma_fn, t, 0, 0)  # fully inside
    assert np.array_equal(got, _expected(bits[:64, :64]))


def test_encode_rejects_before_the_driver():
    t = torch.zeros(64, 70, dtype=torch.bfloat16, device="cuda")  # rows of 140 B
    with pytest.raises(TkcLaunchError, match=r"t: cannot make a TMA tensor map: the stride of dim 0 is 140 bytes"):
        tensormap.encode_tiled(t, (64, 64), 3, name="t")


def test_check_launch_on_cuda_tensors():
    from tkc.dtypes import f32
    from tkc.ir.types import ScalarType, TensorType
    from tkc.runtime.args import check_launch

    params = [("a", TensorType(bf16, ("M", "K"))), ("c", TensorType(f32, ("M",))), ("s", ScalarType(f32))]
    a = torch.zeros(100, 72, dtype=torch.bfloat16, device="cuda")[:, :64]
    c = torch.zeros(100, device="cuda")
    assert check_launch("k", params, [a, c, 1.0], tma={"a"}) == {"M": 100, "K": 64}
    with pytest.raises(TkcLaunchError, match="c: expected a CUDA tensor, got a tensor on cpu"):
        check_launch("k", params, [a, c.cpu(), 1.0])
    with pytest.raises(TkcLaunchError, match="a: the data pointer 0x[0-9a-f]+ is not 16-byte aligned"):
        check_launch("k", params, [torch.zeros(100, 65, dtype=torch.bfloat16,
                                        device="cuda")[:, 1:], c, 1.0])
