"""The pin ``tma_vectors`` on examples/attn_train.tk's attn_bwd: lse and delta, 1-D loads along
the last axis of tensors the kernel only reads, ride the loop's TMA ring with Q and dO into
shared memory and each thread reads its values back (``hopper.smem_load``).  The emulator
against the interpreter (head dims 64 and 128, causal and not, lengths with tails, with and
without a producer warpgroup), a read moved before its stage's wait caught by the emulator,
the hopper IR's text round trip and verifier, ptxas without spills, and on a GPU the pin on
against the pin off."""

from __future__ import annotations

import pytest
import torch

from device_checks import assert_atomics_close, assert_no_spills, launch_tensors, needs_ptxas, require_gpu
from tkc.compiler import compile_kernel
from tkc.emulator.machine import emulate
from tkc.errors import TkcEmulatorError, TkcVerifyError
from tkc.interpreter import run_kernel
from tkc.ir.parser import parse_module
from tkc.ir.printer import print_module
from tkc.ir.verifier import verify

from test_attn_train import EXAMPLE, SMALL, inputs

ON = {"tma_vectors": True}


def _consts(D: int, causal: bool, tiles: dict) -> dict:
    return {"D": D, "causal": causal, **tiles, **ON}


def _hopper(consts: dict):
    return compile_kernel(EXAMPLE, consts, stop="hopper", cache=False, kernel="attn_bwd")


def _args(N: int, D: int, B: int = 1, H: int = 4, KVH: int = 2) -> list:
    q, k, v, do = inputs(3, B, H, KVH, N, D)
    g = torch.Generator().manual_seed(4)
    lse = torch.randn(B, H, N, generator=g) + 4
    delta = torch.randn(B, H, N, generator=g)
    zeros = torch.zeros(B, KVH, N, D).bfloat16()
    return [q, k, v, do, lse, delta, torch.zeros(B, H, N, D), zeros, zeros.clone(), D ** -0.5]


def _assert_vectors_ride_tile_rings(kernel, body) -> None:
    """Each vector's copy completes on a full barrier a tile's copy completes on too (its stage
    is freed with that tile's: no barriers of its own, no per-thread release), and its read
    comes after the loop's first product's wait (moved down to its use)."""
    copies = [op for op in kernel.walk() if op.name == "hopper.tma_load"]

    def ring(op):  # the barrier ring a copy completes on
        bar = op.operands[2]
        return bar.owner.operands[0] if bar.owner.name == "hopper.stage" else bar

    tiles = {ring(op) for op in copies if not all(x == 1 for x in op.box[:-1])}
    vectors = [op for op in copies if all(x == 1 for x in op.box[:-1])]
    assert vectors and all(ring(op) in tiles for op in vectors)
    assert not any(op.name == "hopper.mbarrier_arrive" and op.attributes.get("threads") for op in body)
    first_wait = next(i for i, op in enumerate(body) if op.name == "hopper.wgmma_wait")
    assert all(i > first_wait for i, op in enumerate(body) if op.name == "hopper.smem_load")


def _loop(kernel):
    return next(op for op in kernel.walk() if op.name == "tile.for"
                and any(x.name == "hopper.wgmma" for x in op.regions[0].block.ops))


@pytest.mark.parametrize("D, causal, tiles, N", [
    (64, False, SMALL["attn_bwd"], 80),     # one 64-row block and a tail
    (64, True, SMALL["attn_bwd"], 200),
    (64, True, {"BM": 64, "BN": 64, "warp_specialize": True}, 200),  # a producer warpgroup
    (64, False, {"BM": 64, "BN": 64, "warp_specialize": True, "overlap_products": True}, 80),
    (64, False, {}, 200),                   # the default tiles: 128-row query blocks
    (128, False, {}, 80),
    (128, True, {"overlap_products": True}, 132),
])
def test_emulator_matches_interpreter(D: int, causal: bool, tiles: dict, N: int) -> None:
    args = _args(N, D)
    consts = _consts(D, causal, tiles)
    want = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    run_kernel(compile_kernel(EXAMPLE, consts, stop="tkir", cache=False, kernel="attn_bwd").kernel_op, want)
    kernel = _hopper(consts).kernel_op
    body = _loop(kernel).regions[0].block.ops
    names = [op.name for op in kernel.walk()]
    # Both vectors come by TMA (one box along the last axis each) and are read from shared
    # memory in the loop; nothing loads per thread any more.
    assert names.count("hopper.smem_load") == 2 and "hopper.load" not in names
    vectors = [op for op in kernel.walk() if op.name == "hopper.tma_load" and all(x == 1 for x in op.box[:-1])]
    assert len({op.tensor.name_hint for op in vectors}) == 2
    _assert_vectors_ride_tile_rings(kernel, body)
    emulate(kernel, args, seed=5)
    assert_atomics_close(args, want, (6, 7, 8))


def test_the_pin_off_keeps_the_per_thread_loads() -> None:
    names = [op.name for op in _hopper({"D": 64, **SMALL["attn_bwd"], "tma_vectors": False}).kernel_op.walk()]
    assert "hopper.smem_load" not in names and names.count("hopper.load") == 2


def test_a_read_before_its_stage_landed_is_caught() -> None:
    """lse's read moved above the wait for its stage, with a producer warpgroup issuing the
    copies: the consumers read bytes no copy has written yet, and the emulator says so.
    (Without a producer the reading warpgroups issue the copy themselves, and the emulator's
    copies land at once: a read before the wait then reads what the copy wrote, for a
    ``hopper.smem_load`` as for a wgmma.)"""
    consts = _consts(64, False, {"BM": 64, "BN": 64, "warp_specialize": True})
    kernel = _hopper(consts).kernel_op
    block = next(op for op in kernel.walk() if op.name == "hopper.smem_load").parent
    ops = block.ops
    read = next(op for op in ops if op.name == "hopper.smem_load")
    stage = read.src.owner  # the ring's stage this iteration reads
    wait = next(op for op in ops if op.name == "hopper.mbarrier_wait")  # the iteration's first
    assert stage.name == "hopper.stage" and ops.index(wait) < ops.index(stage)
    for op in (stage, read):
        ops.remove(op)
        ops.insert(ops.index(wait), op)
    with pytest.raises(TkcEmulatorError, match="lse_smem.*which nothing has written"):
        emulate(kernel, _args(200, 64), seed=5)


def test_the_hopper_ir_round_trips_and_verifies() -> None:
    text = _hopper(_consts(64, True, SMALL["attn_bwd"])).asm["hopper"]
    assert "hopper.smem_load" in text
    module = parse_module(text, "k.hopper.tkir")
    verify(module)
    assert print_module(module) == text


def test_the_verifier_refuses_a_read_of_another_tile_and_a_box_past_it() -> None:
    text = _hopper(_consts(64, False, {})).asm["hopper"]
    lines = text.splitlines()
    i = next(k for k, line in enumerate(lines) if "hopper.smem_load" in line)
    # 64 values from a 32 x 4 tile that holds 128: refused.
    bad = lines[i].replace(": tile<128xf32", ": tile<64xf32")
    assert bad != lines[i]
    with pytest.raises(TkcVerifyError):
        verify(parse_module("\n".join([*lines[:i], bad, *lines[i + 1:]]), "k.hopper.tkir"))
    # A vector box longer than the tile: refused.
    j = next(k for k, line in enumerate(lines) if "hopper.tma_load %lse" in line)
    bad = lines[j].replace("box = [1, 1, 128]", "box = [1, 1, 64]")
    assert bad != lines[j]
    with pytest.raises(TkcVerifyError):
        verify(parse_module("\n".join([*lines[:j], bad, *lines[j + 1:]]), "k.hopper.tkir"))


@needs_ptxas
@pytest.mark.parametrize("D, causal", [(64, False), (64, True), (128, False), (128, True)])
def test_assembles_without_spills(D: int, causal: bool) -> None:
    c = compile_kernel(EXAMPLE, {"D": D, "causal": causal, **ON}, stop="cubin", cache=False, kernel="attn_bwd")
    assert "hopper.smem_load" in c.asm["hopper"]
    assert_no_spills(c)


@pytest.mark.gpu
@pytest.mark.parametrize("B, H, KVH, N", [(2, 8, 2, 300), (1, 8, 1, 1000), (1, 4, 4, 2048)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("D", [64, 128])
def test_on_gpu_as_the_pin_off(B: int, H: int, KVH: int, N: int, D: int, causal: bool) -> None:
    """The same inputs, the pin on and off: dK and dV alike (the same products in the same
    order; bf16 rounding at most), dQ within its atomics' rounding."""
    require_gpu()
    q, k, v, do = inputs(7, B, H, KVH, N, D)
    g = torch.Generator().manual_seed(8)
    lse, delta = torch.randn(B, H, N, generator=g) + 4, torch.randn(B, H, N, generator=g)
    outs = []
    for pin in (False, True):
        c = compile_kernel(EXAMPLE, {"D": D, "causal": causal, "tma_vectors": pin}, kernel="attn_bwd")
        assert ("hopper.smem_load" in c.asm["hopper"]) == pin
        zeros = torch.zeros(B, KVH, N, D).bfloat16()
        args = [q, k, v, do, lse, delta, torch.zeros(B, H, N, D), zeros, zeros.clone(), D ** -0.5]
        outs.append(launch_tensors(c, args)[6:9])
    (dq0, dk0, dv0), (dq1, dk1, dv1) = outs
    for got, want in ((dk1, dk0), (dv1, dv0)):
        torch.testing.assert_close(got.float(), want.float(), rtol=1e-2, atol=1e-3 * max(1.0, want.abs().max().item()))
    torch.testing.assert_close(dq1, dq0, rtol=1e-5, atol=1e-5 * max(1.0, dq0.abs().max().item()))


@pytest.mark.parametrize("D, causal, square", [(64, True, False), (64, False, True), (128, True, False)])
def test_varlen_backward_emulated_as_interpreted(D: int, causal: bool, square: bool, monkeypatch) -> None:
    """examples/varlen_attn_train.tk's backward reads lse[h, rows_at(cu[s], s) + rows] and delta
    of packed sequences, each sequence's rows at a multiple of 128: by TMA too
    (tkc.passes.divisors knows the column a multiple of 16 bytes; at cu[s] itself it would not
    be, and a TMA copy from token 2641 stopped an H200), and the same where a block runs past
    the sequence's end."""
    import test_varlen_attn_train as varlen

    plain = varlen._consts
    monkeypatch.setattr(varlen, "_consts", lambda name, *a: {**plain(name, *a), **ON}
                        if name == "varlen_attn_bwd" else plain(name, *a))
    tiles = varlen.SQUARE if square else (varlen.SMALL if D == 64 else {})
    hopper = compile_kernel(varlen.EXAMPLE, varlen._consts("varlen_attn_bwd", D, causal, tiles), stop="hopper",
                            cache=False, kernel="varlen_attn_bwd").asm["hopper"]
    assert hopper.count("hopper.smem_load") == 2
    varlen.test_emulator_matches_interpreter("varlen_attn_bwd", D, causal, tiles)


#: A loop in the shape of attention's: x's tiles by TMA, and a 1-D run of s beside them.
COLSHIFT = '''
@kernel
def colshift(x: bf16[M, D], w: bf16[N, D], s: f32[B, M], out: f32[B, N, M], shift: i32, BM: const = 64,
             BN: const = 64, D: const = 64):
    grid(cdiv(N, BN), B)
    j = program_id(0)
    b = program_id(1)
    wt = w[j*BN:(j+1)*BN, :]
    for i in range(cdiv(M, BM)):
        xt = x[i*BM:(i+1)*BM, :]
        l = s[b, OFF:OFF + BM]
        out[b, j*BN:(j+1)*BN, i*BM:(i+1)*BM] = wt @ xt.T - l[None, :]
    WRITE
'''


@pytest.mark.parametrize("offset, write, rides", [
    ("i*BM", "", True),
    # computed after x's copy (and a column not known to be a multiple of 16 bytes): it stays
    ("i*BM + shift", "", False),
    ("i*BM", "s[b, 0:BM] = zeros([BM], f32)", False),  # the kernel writes s
])
def test_which_loads_ride_the_ring(offset: str, write: str, rides: bool) -> None:
    source = COLSHIFT.replace("OFF", offset).replace("WRITE", write)
    kernel = compile_kernel(source, ON, stop="hopper", cache=False).kernel_op
    names = [op.name for op in kernel.walk()]
    assert (names.count("hopper.smem_load"), names.count("hopper.load")) == ((1, 0) if rides else (0, 1))
    if not rides:
        return
    # Its read is the loop's last use of a stage (behind the product's wait): no product
    # issued after it frees a tile's stage, so the vector keeps rings of its own, released
    # by every thread right behind the read.
    assert any(op.name == "hopper.mbarrier_arrive" and op.attributes.get("threads") for op in kernel.walk())
    B, M, N, D = 2, 200, 100, 64  # tails of 8 rows of x and of s
    g = torch.Generator().manual_seed(11)
    args = [torch.randn(M, D, generator=g).bfloat16(), torch.randn(N, D, generator=g).bfloat16(),
            torch.randn(B, M, generator=g), torch.full((B, N, M), float("nan")), 0]
    want = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    run_kernel(compile_kernel(source, ON, stop="tkir", cache=False).kernel_op, want)
    emulate(kernel, args, seed=2)
    torch.testing.assert_close(args[3], want[3], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
def test_a_call_whose_lse_tma_cannot_read_retries_without_the_default_pin(monkeypatch, causal: bool) -> None:
    """attn_bwd turns tma_vectors on by itself (D = 128, causal or not).  A launch whose lse TMA
    cannot read (N not a multiple of 4: a row stride that is no multiple of 16 bytes) retries
    with the pin off and keeps the tiles' TMA, as it does when the caller sets the pin."""
    import sys

    from tkc.errors import TkcTmaStrideError

    kernel_mod = sys.modules["tkc.kernel"]

    launched, refused, planned = [], [], []

    def launch(compiled, args, grid=None):
        consts = compiled.kernel_op.attributes["consts"]
        if consts.get("tma_vectors"):
            refused.append(compiled)
            raise TkcTmaStrideError("error: lse: axis 1 has a stride of 4004 bytes")
        launched.append({c: consts.get(c) for c in ("tma_vectors", "tma")})
        planned.append(compiled)

    class Runtime:  # the runtime's plans: a compilation launched before launches again at once
        @staticmethod
        def launch_planned(compiled, args, grid):
            if any(c is compiled for c in planned):
                launched.append("planned")
                return True
            return None

    monkeypatch.setattr(kernel_mod, "_launch", lambda: launch)
    monkeypatch.setattr(kernel_mod, "_any_cuda", lambda args: True)
    monkeypatch.setattr(kernel_mod, "interpret_requested", lambda: False)
    monkeypatch.setattr(kernel_mod, "_runtime", Runtime)
    k = kernel_mod.load(EXAMPLE, "attn_bwd")
    B, H, N, D = 1, 2, 1001, 128
    q = torch.zeros(B, H, N, D).bfloat16()
    args = [q, q, q, q, torch.zeros(B, H, N), torch.zeros(B, H, N), torch.zeros(B, H, N, D), q, q, 0.1]
    k(*args, D=D, causal=causal)
    # Once launched, with the tiles still by TMA (no tma=False), after one refusal when the
    # pin was on by default; a second call launches the same compilation by its plan, without
    # being refused again.
    assert launched == [{"tma_vectors": False, "tma": None}] and len(refused) == 1
    k(*args, D=D, causal=causal)
    assert launched[1:] == ["planned"] and len(refused) == 1


def test_a_call_that_pins_tma_hears_of_the_tiles_strides(monkeypatch) -> None:
    """With ``tma`` pinned by the caller nothing falls back to per-thread tiles: where lse's
    strides refuse the vectors and the tiles' refuse TMA too, the error names the tiles'."""
    import sys

    from tkc.errors import TkcTmaStrideError

    kernel_mod = sys.modules["tkc.kernel"]

    def launch(compiled, args, grid=None):
        consts = compiled.kernel_op.attributes["consts"]
        raise TkcTmaStrideError("error: lse: axis 1 has a stride of 4004 bytes" if consts.get("tma_vectors")
                                else "error: q: axis 2 has a stride of 260 bytes")

    monkeypatch.setattr(kernel_mod, "_launch", lambda: launch)
    monkeypatch.setattr(kernel_mod, "_any_cuda", lambda args: True)
    monkeypatch.setattr(kernel_mod, "interpret_requested", lambda: False)
    monkeypatch.setattr(kernel_mod, "_runtime", None)
    k = kernel_mod.load(EXAMPLE, "attn_bwd")
    q = torch.zeros(1, 2, 1001, 128).bfloat16()
    args = [q, q, q, q, torch.zeros(1, 2, 1001), torch.zeros(1, 2, 1001), torch.zeros(1, 2, 1001, 128), q, q, 0.1]
    with pytest.raises(TkcTmaStrideError, match="q: axis 2"):
        k(*args, D=128, tma=True)


@pytest.mark.parametrize("causal", [False, True])
def test_the_vectors_cost_no_stage_at_d64(causal: bool) -> None:
    """At D = 64 lse's and delta's stages (1 KB a stage) would cost Q's and dO's ring its third
    stage; dV's epilogue goes through K's tile instead (loaded once, read only by products
    before it), so the ring keeps three, as without the vectors, where every epilogue keeps a
    tile of its own."""
    def ring_and_epilogues(vectors: bool):
        kernel = _hopper({"D": 64, "causal": causal, "tma_vectors": vectors}).kernel_op
        stages = {op.result.name_hint: op.attributes.get("stages", 1) for op in kernel.walk()
                  if op.name == "hopper.smem_alloc"}
        into = [op.operands[1].name_hint for op in kernel.walk() if op.name == "hopper.tma_store"]
        return stages, into

    stages, into = ring_and_epilogues(True)
    assert stages["q_smem"] == stages["do_smem"] == stages["lse_smem"] == 3
    assert "k_smem" in into and "dv_out" not in stages
    stages, into = ring_and_epilogues(False)
    assert stages["q_smem"] == stages["do_smem"] == 3 and "dv_out" in into
