"""TMA copies of tiles along the tensor's last axis and any other (the rest squeezed): attention
on [B, N, H, D] tensors (``q[b, rows, h, :]``, the layout a projection's output has) loads Q, K
and V and stores O through tensor maps whose boxes are 1 on the batch and head axes.  The
interpreter against torch, the emulator against the interpreter (tails on N), the maps in the
hopper IR, and on a GPU the same as the interpreter."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from device_checks import interpret_and_emulate, interpret_and_run_on_gpu, lowered

from tkc.compiler import compile_kernel
from tkc.interpreter import random_args, run_kernel

BSHD = """@kernel
def attn(q: bf16[B, N, H, D], k: bf16[B, N, H, D], v: bf16[B, N, H, D], o: bf16[B, N, H, D], sm_scale: f32,
         D: const = 64, BM: const = 64, BN: const = 64):
    grid(cdiv(N, BM), B * H)
    i = program_id(0)
    b = program_id(1) // H
    h = program_id(1) % H
    qt = q[b, i*BM:(i+1)*BM, h, :]
    m_i = full([BM], -inf, f32)
    l_i = zeros([BM], f32)
    acc = zeros([BM, D], f32)
    for j in range(cdiv(N, BN)):
        kt = k[b, j*BN:(j+1)*BN, h, :]
        vt = v[b, j*BN:(j+1)*BN, h, :]
        cols = j*BN + arange(BN)
        s = where(cols[None, :] < N, (qt @ kt.T) * sm_scale, -inf)
        m_new = maximum(m_i, s.max(1))
        p = exp(s - m_new[:, None])
        alpha = exp(m_i - m_new)
        l_i = l_i * alpha + p.sum(1)
        acc = acc * alpha[:, None] + p.to(bf16) @ vt
        m_i = m_new
    o[b, i*BM:(i+1)*BM, h, :] = (acc / l_i[:, None]).to(bf16)
"""
DIMS = {"B": 2, "N": 80, "H": 3}


def _compile(stop: str):
    return compile_kernel(BSHD, stop=stop, cache=False)


def _torch(args: list) -> np.ndarray:
    q, k, v = (torch.from_numpy(np.asarray(a, np.float32)).transpose(1, 2) for a in args[:3])
    return F.scaled_dot_product_attention(q, k, v, scale=float(args[4])).transpose(1, 2).numpy()


def test_interpreter_matches_torch() -> None:
    args = random_args(_compile("tkir").kernel_op, DIMS, 0)
    run_kernel(_compile("tkir").kernel_op, args)
    np.testing.assert_allclose(np.asarray(args[3], np.float32), _torch(args), rtol=2e-2, atol=2e-2)


def test_emulator_matches_interpreter_without_spills() -> None:
    tile_ir = _compile("tkir").kernel_op
    want, got = interpret_and_emulate(tile_ir, lowered(_compile).kernel_op, random_args(tile_ir, DIMS, 1), 1)
    np.testing.assert_allclose(np.asarray(got[3], np.float32), np.asarray(want[3], np.float32), rtol=1e-2, atol=1e-2)


def test_the_copies_are_tma_with_boxes_of_one_on_the_squeezed_axes() -> None:
    text = _compile("hopper").asm["hopper"]
    assert text.count("hopper.tma_load") >= 3 and "hopper.tma_store" in text
    assert "hopper.load" not in text.replace("hopper.load_", "")  # nothing read thread by thread
    for param in range(4):  # q, k, v, o: one map each, 64 rows on axis 1, 64 columns, 1 on B and H
        assert f"[{param}, [1, 64, 1, 64], 128]" in text, text[:2000]


@pytest.mark.gpu
def test_on_gpu_as_in_the_interpreter() -> None:
    _, want, got = interpret_and_run_on_gpu(_compile, DIMS)
    np.testing.assert_allclose(got[3], np.asarray(want[3], np.float64), rtol=2e-2, atol=2e-2)
