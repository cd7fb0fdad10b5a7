"""Every example on a real GPU, through the whole compiler and the runtime, against torch.

Run on a Hopper machine: ``python -m pytest -m gpu tests/gpu -q``.  Without a CUDA GPU
every test here is skipped.  Inputs are fresh random CUDA tensors whose shapes are not tile
multiples; outputs start as NaN, so an element the kernel never writes fails the
comparison.  Failure messages give the seed, the worst error and where it is.
"""

from __future__ import annotations

import math
import re
import secrets
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)"),
]

from device_checks import RUN_KERNELS, lowered_examples  # noqa: E402

from tkc.compiler import Compiled, compile_kernel  # noqa: E402
from tkc.errors import TkcLaunchError  # noqa: E402
from tkc.runtime.launch import launch, launch_state  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
BF16 = {"atol": 2e-2, "rtol": 2e-2}


@pytest.fixture
def rng() -> tuple[torch.Generator, int]:
    seed = secrets.randbits(31)
    return torch.Generator(device="cuda").manual_seed(seed), seed


def randn(g: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=g, device="cuda").to(torch.bfloat16)


def poisoned(*shape: int) -> torch.Tensor:
    return torch.full(shape, float("nan"), dtype=torch.bfloat16, device="cuda")


def check(what: str, out: torch.Tensor, ref: torch.Tensor, seed: int, atol: float, rtol: float) -> None:
    """Every element written and within ``atol + rtol * |ref|``; else a message with the seed,
    how many elements are wrong, the worst one and its index."""
    torch.cuda.synchronize()
    got, want = out.float().cpu(), ref.float().cpu()
    nan = torch.isnan(got) & ~torch.isnan(want)
    if nan.any():
        first = tuple(int(i) for i in nan.nonzero()[0])
        pytest.fail(f"{what} (seed {seed}): {int(nan.sum())} of {got.numel()} outputs are NaN (never written?), "
                    f"first at {first}")
    err = (got - want).abs()
    bad = err > atol + rtol * want.abs()
    if bad.any():
        worst = _unravel(int((err * bad).flatten().argmax()), err.shape)
        pytest.fail(f"{what} (seed {seed}): {int(bad.sum())} of {got.numel()} outputs off; max abs error "
                    f"{err.max().item():.4g}, worst at {worst}: got {got[worst].item():.6g}, expected "
                    f"{want[worst].item():.6g} (atol {atol}, rtol {rtol})")


def _unravel(flat: int, shape: torch.Size) -> tuple[int, ...]:
    idx = []
    for n in reversed(shape):
        idx.append(flat % n)
        flat //= n
    return tuple(reversed(idx))


def compiled(name: str, consts: dict | None = None) -> Compiled:
    return compile_kernel(EXAMPLES / name, consts or {})


# ------------------------------------------------------------------ examples
# 256x128: four consumer warpgroups, whose setmaxnreg budget must fit the 61440 registers a
# 640-thread CTA is launched with (asking for the register file's share hangs the kernel);
# with consumers=2, two warpgroups of two 64-row wgmma slices each; 128x128, 192x128 and 256x64 on one.
@pytest.mark.parametrize("consts", [{}, {"BM": 64, "BN": 64, "BK": 32}, {"BM": 256, "BN": 128},
                                    {"BM": 256, "BN": 128, "consumers": 2}, {"BM": 128, "BN": 128, "consumers": 1},
                                    {"BM": 192, "BN": 128, "consumers": 1}, {"BM": 256, "BN": 64, "consumers": 1}],
                         ids=["default", "64x64x32", "256x128", "256x128-consumers2", "128x128-consumers1",
                              "192x128-consumers1", "256x64-consumers1"])
@pytest.mark.parametrize("M,N,K", [(128, 128, 64), (300, 200, 136), (77, 264, 72)])
def test_gemm(rng, consts: dict, M: int, N: int, K: int) -> None:
    g, seed = rng
    a, b, c = randn(g, M, K), randn(g, K, N), poisoned(M, N)
    launch(compiled("gemm.tk", consts), [a, b, c])
    check(f"gemm {M}x{N}x{K} {consts}", c, (a.float() @ b.float()).to(torch.bfloat16), seed, atol=3e-2, rtol=2e-2)


@pytest.mark.parametrize("consts", [{"cluster": 2}, {"cluster": 2, "BN": 128},
                                    {"cluster": 2, "BM": 256, "BN": 128, "consumers": 2}],
                         ids=["default", "BN128", "256x128-consumers2"])
@pytest.mark.parametrize("M,N,K,grid", [(128, 128, 64, None), (300, 200, 136, None), (640, 1000, 520, None),
                                        (2048, 1024, 1024, (8,))])  # (8,): 4 clusters walk 32 cluster tiles
def test_gemm_in_clusters(rng, consts: dict, M: int, N: int, K: int, grid) -> None:
    g, seed = rng
    a, b, c = randn(g, M, K), randn(g, K, N), poisoned(M, N)
    launch(compiled("gemm.tk", consts), [a, b, c], grid=grid)
    check(f"gemm {M}x{N}x{K} {consts} grid {grid}", c, (a.float() @ b.float()).to(torch.bfloat16), seed,
          atol=3e-2, rtol=2e-2)


SPLIT_K = (Path(__file__).resolve().parents[1] / "data" / "splitk.tk").read_text()


@pytest.mark.parametrize("M,N,K", [(128, 128, 520), (64, 192, 64), (200, 136, 304)])
def test_split_k_across_a_cluster(rng, M: int, N: int, K: int) -> None:
    g, seed = rng
    a, b = randn(g, M, K), randn(g, K, N)
    c = torch.full((M, N), float("nan"), device="cuda")
    launch(compile_kernel(SPLIT_K, {}, file="splitk.tk"), [a, b, c])
    check(f"split-K {M}x{N}x{K}", c, a.float() @ b.float(), seed, atol=1e-3, rtol=1e-3)


LOOP_REDUCE = (Path(__file__).resolve().parents[1] / "data" / "loopred.tk").read_text()


@pytest.mark.parametrize("cols", [64, 128])
@pytest.mark.parametrize("steps", [5, 40])
def test_a_cluster_reduction_in_a_loop(rng, cols: int, steps: int) -> None:
    """tests/data/loopred.tk: its two buffers and barriers taken in turn every iteration; at 64
    columns half the threads send (and the CTA meets after the reads), at 128 every thread."""
    from tkc.interpreter import run_kernel

    g, seed = rng
    src = LOOP_REDUCE.replace("64", str(cols))
    x = torch.randn(64, cols, generator=g, device="cuda") * 0.1
    y = torch.full_like(x, float("nan"))
    compiled_kernel = compile_kernel(src, {"steps": steps}, file="loopred.tk")
    launch(compiled_kernel, [x, y])
    want = torch.full((64, cols), float("nan"))
    run_kernel(compile_kernel(src, {"steps": steps}, file="loopred.tk", stop="tkir").kernel_op, [x.cpu(), want])
    check(f"loop of cluster reductions, {cols} columns, {steps} steps", y, want.cuda(), seed, atol=1e-5, rtol=1e-4)


NESTED_REDUCE = (Path(__file__).resolve().parents[1] / "data" / "nestedred.tk").read_text()


@pytest.mark.parametrize("consts", [{}, {"cluster": 4, "outer": 2, "inner": 5}], ids=str)
def test_cluster_reductions_in_nested_loops_and_branches(rng, consts: dict) -> None:
    """tests/data/nestedred.tk against the interpreter: the exchange counts of three reductions
    threaded through two loops and a branch."""
    from tkc.interpreter import run_kernel

    g, seed = rng
    x = torch.randn(16, 64, generator=g, device="cuda")
    y = torch.full_like(x, float("nan"))
    launch(compile_kernel(NESTED_REDUCE, consts, file="nestedred.tk"), [x, y])
    want = torch.full((16, 64), float("nan"))
    run_kernel(compile_kernel(NESTED_REDUCE, consts, file="nestedred.tk", stop="tkir").kernel_op, [x.cpu(), want])
    check(f"nested cluster reductions {consts}", y, want.cuda(), seed, atol=1e-5, rtol=1e-4)


def test_a_cluster_kernel_refuses_a_grid_of_part_clusters(rng) -> None:
    g, _ = rng
    a, b, c = randn(g, 256, 64), randn(g, 64, 256), poisoned(256, 256)
    with pytest.raises(TkcLaunchError, match="multiple of 2"):
        launch(compiled("gemm.tk", {"cluster": 2}), [a, b, c], grid=(3,))


@pytest.mark.parametrize("M,N,K", [(128, 128, 128), (300, 200, 160), (77, 264, 80)])
def test_gemm_fp8(rng, M: int, N: int, K: int) -> None:
    g, seed = rng
    a = torch.randn(M, K, generator=g, device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn(N, K, generator=g, device="cuda").to(torch.float8_e4m3fn)
    c = poisoned(M, N)
    launch(compiled("gemm_fp8.tk"), [a, b, c])
    check(f"gemm_fp8 {M}x{N}x{K}", c, (a.float() @ b.float().T).to(torch.bfloat16), seed, atol=3e-2, rtol=2e-2)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("N", [128, 200, 77])
def test_attention(rng, causal: bool, D: int, N: int) -> None:
    g, seed = rng
    B, H = 2, 3
    q, k, v = (randn(g, B, H, N, D) for _ in range(3))
    o = poisoned(B, H, N, D)
    scale = 1 / math.sqrt(D)
    launch(compiled("attn.tk", {"D": D, "causal": causal}), [q, k, v, o, scale])
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal,
                                                           scale=scale)
    check(f"attn B={B} H={H} N={N} D={D} causal={causal}", o, ref, seed, **BF16)


# The schedules the benchmark harness may pick: the next S issued ahead, the last P V deferred,
# two consumers taking turns, three consumer warpgroups (192 query rows), and D = 256's 64- and
# 80-key blocks.
ATTN_PINS = [{"D": 128, "issue_ahead": True}, {"D": 64, "pingpong": True}, {"D": 64, "BM": 192},
             {"D": 256, "BN": 64}, {"D": 256, "BN": 64, "pingpong": True},
             {"D": 64, "BM": 64, "BN": 128, "ctas_per_sm": 2, "issue_ahead": True},
             {"D": 128, "BM": 64, "BN": 64, "ctas_per_sm": 2, "issue_ahead": True},
             {"D": 128, "persistent": True}, {"D": 128, "persistent": True, "issue_ahead": True},
             {"D": 128, "persistent": True, "stages": 2},
             {"D": 64, "persistent": True}, {"D": 64, "BM": 192, "persistent": True},
             {"D": 256, "BN": 64, "persistent": True},
             {"D": 128, "BM": 64, "BN": 64, "ctas_per_sm": 2, "persistent": True},  # one Q stage
             # O stored thread by thread (the default goes through a shared tile and TMA)
             {"D": 128, "issue_ahead": True, "tma_store": False}, {"D": 64, "BM": 192, "tma_store": False},
             {"D": 256, "BN": 64, "pingpong": True, "tma_store": False},
             {"D": 64, "BM": 192, "persistent": True, "tma_store": False},
             # both of FlashAttention-3's overlaps: turns, and S issued ahead with its turn
             {"D": 128, "pingpong": True, "issue_ahead": True}, {"D": 64, "pingpong": True, "issue_ahead": True},
             {"D": 128, "persistent": True, "pingpong": True, "issue_ahead": True},
             # P V of block j - 1 in flight through block j's softmax (defer_last), with and
             # without turns, persistent, two stages (the TMA store's shared tile) and three
             {"D": 128, "defer_last": True}, {"D": 128, "defer_last": True, "tma_store": False},
             {"D": 128, "defer_last": True, "pingpong": True, "tma_store": False},
             {"D": 128, "defer_last": True, "persistent": True, "tma_store": False},
             {"D": 64, "BM": 192, "defer_last": True}, {"D": 256, "BN": 64, "defer_last": True},
             {"D": 128, "defer_last": True, "pingpong": True}, {"D": 128, "defer_last": True, "persistent": True},
             {"D": 64, "BM": 192, "defer_last": True, "persistent": True},
             {"D": 64, "BM": 192, "defer_last": True, "tma_store": False},
             {"D": 64, "defer_last": True, "persistent": True},
             {"D": 256, "BN": 64, "defer_last": True, "pingpong": True},
             {"D": 256, "BN": 64, "defer_last": True, "persistent": True},
             # 128 query rows on one warpgroup (two 64-row slices, P fed back from registers)
             {"D": 64, "BN": 64, "consumers": 1},
             # 80-key blocks at D = 256 and 192-key ones at D = 128: O staged through Q's shared tile
             {"D": 256, "BN": 80}, {"D": 256, "BN": 80, "defer_last": True},
             {"D": 256, "BN": 80, "defer_last": True, "pingpong": True}, {"D": 128, "BN": 192, "defer_last": True},
             {"D": 128, "BN": 176, "pingpong": True}]


@pytest.mark.parametrize("consts", ATTN_PINS, ids=str)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("N", [200, 1000])
def test_attention_schedules(rng, consts: dict, causal: bool, N: int) -> None:
    g, seed = rng
    B, H, D = 2, 2, consts["D"]
    q, k, v = (randn(g, B, H, N, D) for _ in range(3))
    o = poisoned(B, H, N, D)
    scale = 1 / math.sqrt(D)
    launch(compiled("attn.tk", {**consts, "causal": causal}), [q, k, v, o, scale])
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal,
                                                           scale=scale)
    check(f"attn {consts} B={B} H={H} N={N} causal={causal}", o, ref, seed, **BF16)


@pytest.mark.parametrize("consts", [c for c in ATTN_PINS if c.get("persistent")], ids=str)
@pytest.mark.parametrize("causal", [False, True])
def test_persistent_attention_walks_several_tiles_a_program(rng, consts: dict, causal: bool) -> None:
    """More output tiles than SMs: each program walks several, its rings carried over (causal:
    by a count of K/V blocks that differs from tile to tile)."""
    g, seed = rng
    B, H, N, D = 4, 16, 1000, consts["D"]
    q, k, v = (randn(g, B, H, N, D) for _ in range(3))
    o = poisoned(B, H, N, D)
    launch(compiled("attn.tk", {**consts, "causal": causal}), [q, k, v, o, 1 / math.sqrt(D)])
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal,
                                                           scale=1 / math.sqrt(D))
    check(f"attn {consts} B={B} H={H} N={N} causal={causal}", o, ref, seed, **BF16)


# Scripts that may hang or trap the GPU run in a process of their own (``in_own_process``):
# sys.argv[1] is their input, then the checkout and tests/ (conftest maps tkc.runtime as for
# the tests).
PRELUDE = """
import sys
sys.path[:0] = sys.argv[2:4]
import conftest, torch, tkc
"""


def in_own_process(script: str, arg: Path, cwd: Path, timeout: float):
    """Run ``PRELUDE + script`` with ``arg`` in a fresh Python; the CompletedProcess (raises
    subprocess.TimeoutExpired past ``timeout`` seconds)."""
    import subprocess

    return subprocess.run([sys.executable, "-c", PRELUDE + script, str(arg), str(ROOT), str(ROOT / "tests")],
                          capture_output=True, text=True, timeout=timeout, cwd=cwd)


STALL_SCRIPT = """
from pathlib import Path
from tkc.compiler import compile_kernel
from tkc.runtime.launch import launch
B, H, N, D = 32, 32, 512, 64
pins = {"D": D, "BM": 192, "persistent": True, "defer_last": True}
q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
o, o2 = torch.empty_like(q), torch.empty_like(q)
causal = compile_kernel(Path(sys.argv[1]), {**pins, "causal": True})
plain = compile_kernel(Path(sys.argv[1]), {**pins, "causal": False})
flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
for i in range(1500):
    flush.zero_()
    launch(causal, [q, k, v, o, 0.125])
    if i % 3 == 0:
        launch(plain, [q, k, v, o2, 0.125])
torch.cuda.synchronize()
ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.125)
print("max error", (o.float() - ref.float()).abs().max().item())
"""


def test_persistent_attention_does_not_stall_over_many_launches(tmp_path: Path) -> None:
    """Persistent causal attention with three consumers, launched 1500 times between L2
    flushes and launches of its non-causal twin, in a process of its own: its producer's
    three idle warps once fell two phases behind a ring and waited forever, within 250
    launches on an H100 (the producer now runs on one warp)."""
    import subprocess

    try:
        r = in_own_process(STALL_SCRIPT, EXAMPLES / "attn.tk", tmp_path, timeout=180)
    except subprocess.TimeoutExpired:
        pytest.fail("1500 launches of persistent causal attention (D=64, BM=192) did not finish in 180 s: stalled")
    assert r.returncode == 0, r.stderr[-2000:]
    assert float(r.stdout.split()[-1]) < 2e-2, r.stdout


TIMEOUT_SCRIPT = """
from tkc.compiler import compile_kernel
from tkc.ir.parser import parse_module
from tkc.runtime.launch import launch
text = open(sys.argv[1]).read().replace("hopper.mbarrier_arrive %e\\n", "")  # the consumers never release
text = text.replace("consts = {BM = 128", "consts = {wait_timeout_ms = 300, BM = 128")
k = compile_kernel(parse_module(text, "gemm_ws.tkir"), pipeline="", hopper_pipeline="", cache=False)
a = torch.randn(256, 512, device="cuda").to(torch.bfloat16)
b = torch.randn(512, 512, device="cuda").to(torch.bfloat16)
c = torch.empty(256, 512, device="cuda", dtype=torch.bfloat16)
try:
    launch(k, [a, b, c])
    torch.cuda.synchronize()
except Exception as e:
    print("launch failed:", type(e).__name__, str(e).splitlines()[0], flush=True)
    sys.exit(3)
print("no error", flush=True)
"""


def test_a_wait_that_times_out_names_itself(tmp_path: Path) -> None:
    """The pin wait_timeout_ms on a kernel that deadlocks (the hand-written warp-specialized GEMM
    with its consumers' releases removed): each waiting warp prints the wait's source line and
    the kernel stops, so the launch fails instead of hanging."""
    import subprocess

    data = ROOT / "tests" / "data" / "hopper" / "gemm_ws.tkir"
    try:
        r = in_own_process(TIMEOUT_SCRIPT, data, tmp_path, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("the deadlocked kernel still hangs with wait_timeout_ms = 300")
    assert r.returncode == 3, r.stdout[-2000:] + r.stderr[-2000:]
    lines = data.read_text().splitlines()
    refill = next(i for i, line in enumerate(lines, 1) if "hopper.mbarrier_wait %e2" in line)  # the producer's
    full = next(i for i, line in enumerate(lines, 1) if "hopper.mbarrier_wait %f," in line)  # the consumers'
    for line in (refill, full):
        assert re.search(rf"tkc: gemm_ws.tkir:{line}:\d+: mbarrier wait timed out after 300 ms \(wait_timeout_ms\): "
                         rf"CTA \(\d+, \d+, 0\) thread \d+ waits for parity \d of the barrier at shared address "
                         rf"\d+\n", r.stdout), r.stdout[-2000:]


# The defaults (one row a program, 4096-column blocks), 16 x 256 blocks, and a 16k-wide row over
# sixteen warps; rows of one block and of several, the last one partial.  With the pin prefetch,
# blocks fetched into L2 one and two iterations ahead (16-row boxes: a request a row).
NORM_CONSTS = [{}, {"BM": 16, "BN": 256}, {"BN": 16384, "warps": 16}, {"BN": 256, "prefetch": 2},
               {"BM": 16, "BN": 256, "prefetch": 1}]


# softmax_split.tk: a row over the programs of a cluster (2 or 4), one block a program or two
# sweeps; 70000 columns are more than 4 x 16384.
SOFTMAXES = [("softmax.tk", c) for c in NORM_CONSTS] + [
    ("softmax_split.tk", c) for c in ({"BN": 256, "cluster": 4}, {"BN": 4096, "cluster": 2, "warps": 8},
                                      {"BN": 16384, "cluster": 4})]


@pytest.mark.parametrize("example,consts", SOFTMAXES, ids=str)
@pytest.mark.parametrize("M,N", [(32, 512), (100, 1000), (5, 40), (7, 9000), (3, 70000)])
def test_softmax(rng, M: int, N: int, example: str, consts: dict) -> None:
    g, seed = rng
    x, y = randn(g, M, N), poisoned(M, N)
    launch(compiled(example, consts), [x, y])
    check(f"{example} {M}x{N}", y, torch.softmax(x.float(), dim=-1), seed, **BF16)


@pytest.mark.parametrize("consts", NORM_CONSTS, ids=str)
@pytest.mark.parametrize("M,N", [(32, 512), (77, 700), (3, 48), (7, 9000)])
def test_layernorm(rng, M: int, N: int, consts: dict) -> None:
    g, seed = rng
    x, w, b, y = randn(g, M, N), randn(g, N), randn(g, N), poisoned(M, N)
    eps = 1e-5
    launch(compiled("layernorm.tk", consts), [x, w, b, y, eps])
    ref = torch.nn.functional.layer_norm(x.float(), (N,), w.float(), b.float(), eps)
    check(f"layernorm {M}x{N}", y, ref, seed, atol=5e-2, rtol=2e-2)


# layernorm_split.tk, as softmax_split.tk: one block a program (4 x 16384 over three programs an
# SM, as the harness times it; over four, which only the packed row fits), two sweeps, and 70000
# columns over 4 x 16384.
LAYERNORM_SPLITS = [{"BN": 256, "cluster": 4}, {"BN": 4096, "cluster": 2, "warps": 8},
                    {"BN": 16384, "cluster": 4}, {"BN": 16384, "cluster": 4, "warps": 8, "ctas_per_sm": 2},
                    {"BN": 16384, "cluster": 4, "ctas_per_sm": 4}]


@pytest.mark.parametrize("consts", LAYERNORM_SPLITS, ids=str)
@pytest.mark.parametrize("M,N", [(32, 512), (5, 40), (7, 9000), (3, 65536), (3, 70000)])
def test_layernorm_split(rng, M: int, N: int, consts: dict) -> None:
    g, seed = rng
    x, w, b, y = randn(g, M, N), randn(g, N), randn(g, N), poisoned(M, N)
    launch(compiled("layernorm_split.tk", consts), [x, w, b, y, 1e-5])
    ref = torch.nn.functional.layer_norm(x.float(), (N,), w.float(), b.float(), 1e-5)
    check(f"layernorm_split {M}x{N}", y, ref, seed, atol=5e-2, rtol=2e-2)


# ------------------------------------------------ rows that once broke the examples
# tests/examples/hard_rows.py, as the CPU tests (tests/examples/test_hard_rows.py) run them: a
# softmax row whose first block of columns is -inf gave NaN, and constant LayerNorm rows did.
sys.path.insert(0, str(ROOT / "tests" / "examples"))
import hard_rows  # noqa: E402

sys.path.pop(0)


@pytest.mark.parametrize("example,consts", SOFTMAXES, ids=str)
@pytest.mark.parametrize("N", [1000, 9000, 70000])
def test_softmax_masked_and_extreme_rows(rng, N: int, example: str, consts: dict) -> None:
    g, seed = rng
    x = hard_rows.softmax_rows(g, N, consts.get("BN", 4096)).to(torch.bfloat16)
    y = poisoned(*x.shape)
    launch(compiled(example, consts), [x, y])
    torch.cuda.synchronize()
    hard_rows.check(f"{example} {consts} {N} columns (seed {seed})", y, torch.softmax(x.float(), dim=-1),
                    atol=4e-3, rtol=1e-2)


@pytest.mark.parametrize("example,consts", [("layernorm.tk", c) for c in NORM_CONSTS]
                         + [("layernorm_split.tk", c) for c in LAYERNORM_SPLITS], ids=str)
@pytest.mark.parametrize("N", [3001, 9000, 70000])
def test_layernorm_constant_and_extreme_rows(rng, N: int, example: str, consts: dict) -> None:
    g, seed = rng
    x = hard_rows.norm_rows(g, N).to(torch.bfloat16)
    w, b = randn(g, N), randn(g, N)
    y = poisoned(*x.shape)
    launch(compiled(example, consts), [x, w, b, y, 1e-5])
    torch.cuda.synchronize()
    # The reference in float64: torch's own f32 LayerNorm on the GPU is off by whole units on a
    # row of 1e15 and on long constant rows (its variance is rounding noise), where tkc gives
    # the bias exactly.
    ref = torch.nn.functional.layer_norm(x.double(), (N,), w.double(), b.double(), 1e-5)
    hard_rows.check(f"{example} {consts} {N} columns (seed {seed})", y, ref, atol=5e-2, rtol=2e-2)


@pytest.mark.parametrize("consts", [{}, {"BM": 1, "BN": 4096}], ids=str)
def test_rmsnorm_constant_and_extreme_rows(rng, monkeypatch: pytest.MonkeyPatch, consts: dict) -> None:
    monkeypatch.delenv("TKC_INTERPRET", raising=False)
    mod = _rmsnorm()
    g, seed = rng
    N = 3001
    x = hard_rows.norm_rows(g, N).to(torch.bfloat16)
    w, y = randn(g, N), poisoned(*x.shape)
    mod.rmsnorm(x, w, y, 1e-6, **consts)
    torch.cuda.synchronize()
    hard_rows.check(f"rmsnorm {consts} (seed {seed})", y, mod.reference(x, w, 1e-6), atol=5e-2, rtol=2e-2)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("N", [200, 77])
def test_attention_extreme_heads(rng, causal: bool, D: int, N: int) -> None:
    g, seed = rng
    q, k, v, scale = hard_rows.attention_heads(g, N, D)
    q, k, v = (t.to(torch.bfloat16) for t in (q, k, v))
    o = poisoned(*q.shape)
    launch(compiled("attn.tk", {"D": D, "causal": causal}), [q, k, v, o, 1 / math.sqrt(D)])
    torch.cuda.synchronize()
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal,
                                                           scale=1 / math.sqrt(D))
    hard_rows.check(f"attn D={D} N={N} causal={causal} (seed {seed})", o.float() / scale, ref / scale,
                    atol=2e-2, rtol=2e-2)


def test_gemm_extreme_rows(rng) -> None:
    g, seed = rng
    M, N, K = 300, 200, 136
    a, b, scale = hard_rows.gemm_operands(g, M, N, K)
    a, b = a.to(torch.bfloat16), b.to(torch.bfloat16)
    c = poisoned(M, N)
    launch(compiled("gemm.tk"), [a, b, c])
    torch.cuda.synchronize()
    ref = (a.float() @ b.float()).to(torch.bfloat16)
    hard_rows.check(f"gemm {M}x{N}x{K} (seed {seed})", c.float() / scale, ref.float() / scale, atol=3e-2, rtol=2e-2)


@pytest.mark.parametrize("example,consts", [
    ("layernorm.tk", {}), ("layernorm.tk", {"ctas_per_sm": 1}), ("layernorm.tk", {"BN": 8192}),
    ("layernorm.tk", {"BN": 16384, "warps": 16}), ("softmax.tk", {}), ("softmax.tk", {"BN": 65536, "warps": 8}),
    ("gemm.tk", {}), ("attn.tk", {"D": 64}), ("softmax_split.tk", {"BN": 16384, "cluster": 4}),
    ("layernorm_split.tk", {"BN": 8192, "cluster": 2})], ids=str)
def test_programs_an_sm_agree_with_the_driver(example: str, consts: dict) -> None:
    """The residency the compiler chose programs an SM by (tkc.codegen.occupancy) is what the
    driver's occupancy calculator says for the loaded kernel."""
    from tkc.runtime.launch import _function

    kernel = compiled(example, consts)
    fn = _function(kernel, torch.cuda.current_device())
    assert kernel.programs_per_sm == fn.max_active_blocks(kernel.threads, kernel.smem_bytes or 0)


def _rmsnorm():
    sys.path.insert(0, str(EXAMPLES))
    try:
        import rmsnorm
    finally:
        sys.path.pop(0)
    return rmsnorm


# The default 16 x 256 blocks, and one-row 4096-column blocks, whose weight row the store loads
# run by run (tkc/codegen/deferred.py).
@pytest.mark.parametrize("consts", [{}, {"BM": 1, "BN": 4096}], ids=str)
@pytest.mark.parametrize("M,N", [(16, 256), (100, 700), (7, 40), (5, 9000)])
def test_rmsnorm_through_the_decorator(rng, monkeypatch: pytest.MonkeyPatch, M: int, N: int, consts: dict) -> None:
    monkeypatch.delenv("TKC_INTERPRET", raising=False)
    mod = _rmsnorm()
    g, seed = rng
    x, w, y = randn(g, M, N), randn(g, N), poisoned(M, N)
    mod.rmsnorm(x, w, y, 1e-6, **consts)
    check(f"rmsnorm {M}x{N}", y, mod.reference(x, w, 1e-6), seed, atol=5e-2, rtol=2e-2)
    assert {"tkir", "hopper", "llvm", "ptx"} <= set(mod.rmsnorm.asm())


# --------------------------------------------------------------- the CLI path
def test_cli_cubin_loads_and_launches(rng, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from tkc.cli import cli
    from tkc.codegen.ptxas import find_ptxas

    if find_ptxas() is None:
        pytest.skip("no ptxas: tkc compile -o gemm.cubin needs one")
    monkeypatch.chdir(tmp_path)
    for out in ("gemm.cubin", "gemm.hopper.tkir"):
        r = CliRunner().invoke(cli, ["compile", str(EXAMPLES / "gemm.tk"), "-o", out])
        assert r.exit_code == 0, r.stderr
    kernel = Compiled.from_asm({"hopper": Path("gemm.hopper.tkir").read_text(),
                                "cubin": Path("gemm.cubin").read_bytes()})
    g, seed = rng
    M, N, K = 200, 136, 104
    a, b, c = randn(g, M, K), randn(g, K, N), poisoned(M, N)
    launch(kernel, [a, b, c])
    check(f"gemm from tkc compile -o gemm.cubin, {M}x{N}x{K}", c, (a.float() @ b.float()).to(torch.bfloat16),
          seed, atol=3e-2, rtol=2e-2)


# ----------------------------------------------------- checks on CUDA tensors
def test_launch_checks_on_cuda_tensors(rng) -> None:
    g, _ = rng
    kernel = compiled("gemm.tk")
    a, b, c = randn(g, 64, 64), randn(g, 64, 64), poisoned(64, 64)
    cases = [
        ([a.t(), b, c], "a: the innermost dim must be contiguous"),
        ([randn(g, 64, 65)[:, 1:], b, c], "not 16-byte aligned"),
        ([randn(g, 64, 100), randn(g, 100, 64), c], "a: axis 0 has a stride of 200 bytes; TMA needs"),
        ([a.cpu(), b, c], "a: expected a CUDA tensor"),
        ([a.float(), b, c], "a: expected a tensor of dtype bf16"),
    ]
    for args, message in cases:
        before = c.clone()
        with pytest.raises(TkcLaunchError) as e:
            launch(kernel, args)
        assert message in e.value.message
        torch.cuda.synchronize()
        assert torch.equal(c.isnan(), before.isnan())  # nothing ran


def test_empty_grid_launches_nothing() -> None:
    a = torch.zeros(0, 64, dtype=torch.bfloat16, device="cuda")
    b = torch.zeros(64, 64, dtype=torch.bfloat16, device="cuda")
    c = torch.zeros(0, 64, dtype=torch.bfloat16, device="cuda")
    assert launch(compiled("gemm.tk"), [a, b, c]) == (0,)  # persistent: min(0 tiles, SMs) programs


@pytest.mark.parametrize("example,args", [
    ("gemm.tk", ["--dim", "M=300", "--dim", "N=200", "--dim", "K=136"]),
    ("gemm_fp8.tk", ["--dim", "M=300", "--dim", "N=200", "--dim", "K=160"]),
    ("attn.tk", ["-D", "causal=true", "--dim", "B=2", "--dim", "H=2", "--dim", "N=200"]),
    ("softmax.tk", ["--dim", "M=40", "--dim", "N=1000"]),
    ("layernorm.tk", ["--dim", "M=40", "--dim", "N=1000"]),
])
def test_tkc_run_checks_the_gpu_against_the_interpreter(example: str, args: list[str]) -> None:
    """`tkc run --backend gpu --check`: the compiled kernel on poisoned outputs against the
    interpreter on the same random inputs, every tensor compared."""
    from click.testing import CliRunner

    from tkc.cli import cli

    r = CliRunner().invoke(cli, ["run", str(EXAMPLES / example), "--backend", "gpu", "--check", "--repeat", "3",
                                 *args])
    assert r.exit_code == 0, r.stdout + r.stderr
    assert "gpu: median kernel time of 3 launches" in r.stdout
    checks = [line for line in r.stdout.splitlines() if line.startswith("  check ")]
    assert checks and all(line.endswith(": ok") for line in checks), r.stdout


@pytest.mark.parametrize("example, kernel", [(e, k) for e in (p.name for p in lowered_examples(EXAMPLES))
                                             for k in RUN_KERNELS.get(e, [None])])
def test_tkc_run_check_with_no_flags_checks_the_gpu(example: str, kernel: str | None) -> None:
    """`tkc run EXAMPLE --check` with a GPU: default dims, the GPU against the interpreter."""
    from click.testing import CliRunner

    from tkc.cli import cli

    r = CliRunner().invoke(cli, ["run", str(EXAMPLES / example), "--check", *(["--kernel", kernel] if kernel else [])])
    assert r.exit_code == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    if lines[0].startswith("schedule for these shapes: "):  # the pins a Python call of these shapes gets
        lines = lines[1:]
    assert "gpu: median kernel time of 1 launches" in lines[0] and lines[1].endswith("(default)"), r.stdout
    checks = [line for line in lines if line.startswith("  check ")]
    assert checks and all(", GPU against interpreter: " in c and c.endswith(": ok") for c in checks), r.stdout


def test_repeated_launches_reuse_the_checked_plan(rng) -> None:
    """A second launch with the same buffers skips the Python-side work, computes with the
    buffers' new contents, and a launch with other buffers is checked again."""
    g, seed = rng
    c_kernel = compiled("gemm.tk")
    a, b, c = randn(g, 256, 128), randn(g, 128, 192), poisoned(256, 192)
    launch(c_kernel, [a, b, c])
    assert len(launch_state(c_kernel).plans) >= 1
    a.copy_(randn(g, 256, 128))  # same buffer, new data
    c.fill_(float("nan"))
    launch(c_kernel, [a, b, c])
    check("gemm relaunch", c, (a.float() @ b.float()).to(torch.bfloat16), seed, atol=3e-2, rtol=2e-2)
    with pytest.raises(TkcLaunchError, match="dtype"):
        launch(c_kernel, [a.float(), b, c])


def _host_us(fn, calls: int = 200, rounds: int = 10) -> float:
    """Best host time of ``fn`` in microseconds over ``rounds`` rounds of ``calls`` calls, as
    benchmarks/launch_overhead.py measures it: the GPU keeps up or queues, and is waited for
    between rounds only."""
    fn()
    best = math.inf
    for _ in range(rounds):
        torch.cuda.synchronize()
        t = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter_ns() - t) / calls / 1e3)
    torch.cuda.synchronize()
    return best


def test_a_new_output_tensor_at_each_call_costs_about_what_a_repeated_launch_does(rng) -> None:
    """``c = torch.empty(...); gemm(a, b, c)``, as a PyTorch program calls a kernel: every
    output right, one checked plan for them all, and the host time of such a launch close to
    that of a launch given the same tensors again (it was ~700 us against ~15 us on an H200,
    when a tensor at a new address was checked anew)."""
    g, seed = rng
    kernel = compiled("gemm.tk")
    a, b = randn(g, 256, 128), randn(g, 128, 192)
    want = (a.float() @ b.float()).to(torch.bfloat16)
    outs = [poisoned(256, 192) for _ in range(70)]  # more than the plans a kernel keeps, each its own address
    for c in outs:
        launch(kernel, [a, b, c])
    for i, c in enumerate(outs):
        check(f"gemm into new output {i}", c, want, seed, atol=3e-2, rtol=2e-2)
    for i in range(4):  # the caching allocator hands out the blocks of earlier outputs again
        c = torch.empty(256, 192, dtype=torch.bfloat16, device="cuda").fill_(float("nan"))
        launch(kernel, [a, b, c])
        check(f"gemm into torch.empty output {i}", c, want, seed, atol=3e-2, rtol=2e-2)
    a2 = randn(g, 256, 128)  # a new input: a TMA operand, whose tensor map follows it
    launch(kernel, [a2, b, c])
    check("gemm with a new a", c, (a2.float() @ b.float()).to(torch.bfloat16), seed, atol=3e-2, rtol=2e-2)
    assert len(launch_state(kernel).plans) == 1

    same = outs[0]
    repeated = _host_us(lambda: launch(kernel, [a, b, same]))
    last = [same]

    def new_output() -> None:
        last[0] = torch.empty(256, 192, dtype=torch.bfloat16, device="cuda")
        launch(kernel, [a, b, last[0]])

    fresh = _host_us(new_output)
    assert fresh < 3 * repeated + 10, (f"a launch on a new output tensor takes {fresh:.1f} us of host time, "
                                       f"one on the same tensors {repeated:.1f} us")


def test_autotune_picks_a_working_configuration_and_caches_it(rng, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    import tkc

    monkeypatch.setenv("TKC_CACHE_DIR", str(tmp_path))
    g, seed = rng
    a, b, c = randn(g, 512, 256), randn(g, 256, 512), poisoned(512, 512)
    configs = [{"BM": 64, "BN": 64}, {"BN": 128}, {"BN": 512}]  # 512 columns: more than one wgmma takes
    log = io.StringIO()
    first = tkc.autotune(EXAMPLES / "gemm.tk", [a, b, c], configs, runs=5, progress=log)
    assert first.consts in configs[:2] and first.seconds > 0 and not first.cache_hit
    assert "[3/3] BN=512: skipped: " in log.getvalue() and "256 columns" in log.getvalue()
    again = tkc.autotune(EXAMPLES / "gemm.tk", [a, b, c], configs, runs=5, progress=log)
    assert again.cache_hit and again.consts == first.consts
    c.fill_(float("nan"))
    launch(compiled("gemm.tk", first.consts), [a, b, c])
    check("gemm with the tuned constants", c, (a.float() @ b.float()).to(torch.bfloat16), seed, atol=3e-2,
          rtol=2e-2)


def test_strides_tma_cannot_take_run_with_the_tma_pin_off(rng) -> None:
    """K = 130: a's rows are 260 bytes apart, which TMA refuses (the error names the pin);
    with tma=False every thread loads its part and the product is right."""
    g, seed = rng
    M, N, K = 200, 136, 130
    a, b, c = randn(g, M, K), randn(g, K, N), poisoned(M, N)
    with pytest.raises(TkcLaunchError, match="pin tma=False"):
        launch(compiled("gemm.tk"), [a, b, c])
    launch(compiled("gemm.tk", {"tma": False}), [a, b, c])
    check("gemm tma=False K=130", c, (a.float() @ b.float()).to(torch.bfloat16), seed, atol=3e-2, rtol=2e-2)


def test_the_decorator_falls_back_to_per_thread_loads_for_odd_strides(rng) -> None:
    """A @tkc.kernel call whose tensors TMA cannot read (K = 130) compiles the tma=False
    variant by itself; a caller who pins tma gets the error instead."""
    sys.path.insert(0, str(Path(__file__).parent))
    from gemm_kernel import gemm

    g, seed = rng
    a, b, c = randn(g, 200, 130), randn(g, 130, 136), poisoned(200, 136)
    gemm(a, b, c, BM=64, BN=64, BK=32)
    check("@tkc.kernel gemm K=130", c, (a.float() @ b.float()).to(torch.bfloat16), seed, atol=3e-2, rtol=2e-2)
    with pytest.raises(TkcLaunchError, match="pin tma=False"):
        gemm(a, b, c, BM=64, BN=64, BK=32, tma=True)


@pytest.mark.parametrize("M,N", [(37, 203), (64, 1000), (5, 9)])
def test_the_element_path_at_every_edge(rng, M: int, N: int) -> None:
    """A copy shifted by (3, 5) rows and columns: the first tiles read at negative offsets,
    no run is 16-byte aligned, so every run goes through the out-of-line element path; the
    elements before the tensor read the fill value."""
    sys.path.insert(0, str(Path(__file__).parent))
    from shift_kernel import shifted

    g, seed = rng
    x, y = randn(g, M, N), poisoned(M, N)
    shifted(x, y)
    ref = torch.full((M, N), 7.0, dtype=torch.bfloat16, device="cuda")
    ref[3:, 5:] = x[:M - 3, :N - 5]
    check("shifted copy", y, ref, seed, atol=0, rtol=0)


@pytest.mark.parametrize("flag", [0, 1])
def test_a_bf16_tile_through_an_if(rng, flag: int) -> None:
    """The tile crosses the if's merge as packed b32 pairs, on either path; exact (doubling
    a bf16 is exact)."""
    sys.path.insert(0, str(Path(__file__).parent))
    from branch_kernel import maybe_double

    g, seed = rng
    x, y = randn(g, 100, 70), poisoned(100, 70)
    maybe_double(x, y, flag)
    check(f"maybe_double flag={flag}", y, x * (2 if flag else 1), seed, atol=0, rtol=0)


def test_scalar_divisions_by_a_loop_invariant_divisor() -> None:
    """Floor division, remainder and cdiv of i32 scalars inside a loop whose divisor comes from
    outside it (the reciprocal lowering), exactly as the interpreter's ops compute them: every
    sign, divisors 1, 0, powers of two and near 2**31, numerators up to INT32_MIN (INT32_MIN //
    -1, the target's choice, is not compared)."""
    import numpy as np

    from tkc.ir.dialects import tile as T

    sys.path.insert(0, str(Path(__file__).parent))
    from division_kernel import divided

    lo, hi = -2**31, 2**31 - 1
    xs = [0, 1, -1, 7, -7, 8, -8, 100, -100, 2**30, -2**30, hi, lo, hi - 1, lo + 1, 123456789, -987654321]
    ds = [1, -1, 2, -2, 3, -3, 7, -7, 8, 64, 1000, -1000, 2**30, -2**30, hi, lo, lo + 1, 0]
    gen = torch.Generator().manual_seed(5)
    xs += torch.randint(lo, hi, (47,), generator=gen).tolist()
    ds += torch.randint(lo, hi, (14,), generator=gen).tolist() + torch.randint(-300, 300, (16,), generator=gen).tolist()
    x = torch.tensor(xs, dtype=torch.int32, device="cuda")
    d = torch.tensor(ds, dtype=torch.int32, device="cuda")
    q, r, c = (torch.full((len(ds), len(xs)), 12345, dtype=torch.int32, device="cuda") for _ in range(3))
    divided(x, d, q, r, c)
    a, b = np.meshgrid(np.array(xs, np.int32), np.array(ds, np.int32))
    with np.errstate(all="ignore"):
        for op, got in ((T.FloorDivOp, q), (T.RemOp, r), (T.CdivOp, c)):
            want = np.where(b == 0, 0, op.compute(a, np.where(b == 0, 1, b)))
            chosen = (b == -1) & (a == lo) & (op is not T.RemOp)  # INT32_MIN // -1 inside
            ok = (got.cpu().numpy() == want) | chosen
            assert ok.all(), f"{op.name}: {int((~ok).sum())} wrong, first at (d, x) = " \
                             f"{[(ds[i], xs[j]) for i, j in zip(*np.nonzero(~ok))][:3]}"


@pytest.mark.parametrize("M,N", [(300, 700), (128, 256)])
def test_a_kernel_built_again_on_more_warps(rng, M: int, N: int) -> None:
    """Its 128 x 256 f32 tiles spill on four warps; the launch runs the eight-warp build (256
    threads), row sums and tails included."""
    sys.path.insert(0, str(Path(__file__).parent))
    from wide_kernel import scaled

    g, seed = rng
    x = torch.randn(M, N, generator=g, device="cuda")
    y = torch.full((M, N), float("nan"), device="cuda")
    scaled(x, y)
    compiled = scaled.compiled_for([x, y], ())
    assert compiled.kernel_op.attributes["threads"] == 256 and not compiled.resources.spills
    ref = torch.empty_like(x)
    for c in range(0, N, 256):
        block = x[:, c:c + 256]
        ref[:, c:c + 256] = block * 2.0 + block.sum(1, keepdim=True)
    check("scaled on 8 warps", y, ref, seed, atol=1e-3, rtol=1e-5)
