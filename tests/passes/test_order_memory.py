"""The ``order-memory`` pass: in a loop body with products, a load after the first product
moves up before it (with the product's operand views), and a product whose result only goes
to global memory (an atomic add) moves, with the ops feeding it, above an accumulation right
before it; nothing moves past a store, or above what it reads; the emulator agrees with the
interpreter; attention backward's two statement orders compile to the same PTX."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest
from device_checks import interpret_and_emulate, lowered

from tkc.compiler import compile_kernel
from tkc.interpreter import random_args

SRC = """@kernel
def body(a: bf16[M, 256], w: bf16[64, 128], r: f32[M], y: f32[M, 64], z: f32[M, 64]):
    grid(cdiv(M, 64))
    i = program_id(0)
    acc = zeros([64, 64], f32)
    w0 = w[:, 0:64]
    w1 = w[:, 64:128]
    for j in range(4):
        s = a[i*64:(i+1)*64, j*64:(j+1)*64] @ w0
        rv = r[i*64:(i+1)*64]
        u = (s * rv[:, None]).to(bf16)
        acc += u.T @ w1
        atomic_add(z[i*64:(i+1)*64, :], (u @ w1) * 0.5)
    y[i*64:(i+1)*64, :] = acc
"""
DIMS = {"M": 150}


def _order(src: str, passes: bool = True) -> list[str]:
    c = compile_kernel(src, {"tma_store": False}, stop="hopper", cache=False)
    loop = next(op for op in c.kernel_op.walk() if op.name == "tile.for"
                and any(x.name == "hopper.wgmma" for x in op.regions[0].block.ops))
    names = {"hopper.wgmma": "product", "hopper.load": "load", "tile.atomic": "atomic"}
    out = []
    for op in loop.regions[0].block.ops:
        if op.name in names:
            acc = op.name == "hopper.wgmma" and op.acc in loop.regions[0].block.args
            out.append("accumulation" if acc else names[op.name])
    return out


def test_loads_go_up_and_outputs_before_accumulations() -> None:
    assert _order(SRC) == ["load", "product", "product", "atomic", "accumulation"]


def test_nothing_moves_past_a_store() -> None:
    src = SRC.replace("        rv = r[i*64:(i+1)*64]\n",
                      "        z[i*64:(i+1)*64, :] = s\n        rv = r[i*64:(i+1)*64]\n")
    c = compile_kernel(src, {"tma_store": False}, stop="hopper", cache=False)
    loop = next(op for op in c.kernel_op.walk() if op.name == "tile.for"
                and any(x.name == "hopper.wgmma" for x in op.regions[0].block.ops))
    ops = [op.name for op in loop.regions[0].block.ops]
    assert ops.index("hopper.store") < ops.index("hopper.load")


def test_an_output_reading_the_accumulation_stays() -> None:
    src = SRC.replace("(u @ w1) * 0.5", "acc * 0.5")
    assert _order(src)[-2:] == ["accumulation", "atomic"]


@pytest.mark.parametrize("src", [SRC, SRC.replace("(u @ w1) * 0.5", "acc * 0.5")])
def test_emulator_matches_interpreter(src: str) -> None:
    def to(stop: str):
        return compile_kernel(src, {"tma_store": False}, stop=stop, cache=False)
    tile_ir = to("tkir").kernel_op
    want, got = interpret_and_emulate(tile_ir, lowered(to).kernel_op, random_args(tile_ir, DIMS, 7), 7)
    for i in (3, 4):
        np.testing.assert_allclose(got[i], want[i], rtol=1e-3, atol=1e-2)


EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "attn_train.tk"


@pytest.mark.parametrize("D, causal", [(64, False), (128, False), (128, True)])
def test_attention_backward_statement_orders_compile_alike(D: int, causal: bool) -> None:
    text = EXAMPLE.read_text()
    dl = "        dl = delta[b, h, i*BM:(i+1)*BM]\n"
    dk = "        dk_acc += dst @ qt\n"
    lse = "        l = lse[b, h, i*BM:(i+1)*BM] * 1.4426950408889634\n"
    tail = "    dk[b, kh, j*BN:(j+1)*BN, :] = (dk_acc * sm_scale).to(bf16)\n"
    assert all(text.count(x) == 1 for x in (dl, dk, lse, tail))
    other = text.replace(dl, "").replace(lse, lse + dl).replace(dk, "").replace(tail, dk + tail)
    assert other != text

    def ptx(source):
        c = compile_kernel(source, {"D": D, "causal": causal}, stop="ptx", cache=False, kernel="attn_bwd")
        return c.asm["ptx"]
    assert ptx(EXAMPLE) == ptx(other)


def test_a_products_operand_tile_keeps_its_place() -> None:
    """A RoPE projection written as two products a K step (each head's halves) loads W's
    second half after the first product: a TMA copy of a product's operand, whose rings
    pipeline-loops builds in the order of the copies."""
    from tkc.passes.pipeline import HOPPER_PIPELINE

    gemm_rope = pathlib.Path(__file__).resolve().parents[1] / "data" / "gemm_rope_two_products.tk"
    without = HOPPER_PIPELINE.replace("order-memory,", "")
    assert without != HOPPER_PIPELINE
    ptx = [compile_kernel(gemm_rope, {}, stop="ptx", cache=False, hopper_pipeline=p).asm["ptx"]
           for p in (HOPPER_PIPELINE, without)]
    assert ptx[0] == ptx[1]
