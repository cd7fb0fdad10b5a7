"""Launch-argument checks of the GPU runtime, on CPU: the shared signature binding
(``tkc.signature``) and the GPU-specific rules (``tkc.runtime.args``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tkc import signature
from tkc.dtypes import bf16, f32, i1, i32
from tkc.errors import TkcLaunchError
from tkc.interpreter import run_kernel
from tkc.ir.parser import parse_module
from tkc.ir.types import ScalarType, TensorType
from tkc.runtime.args import check_devices, check_launch, check_layout

CUDA0 = torch.device("cuda", 0)
PARAMS = [
    ("a", TensorType(bf16, ("M", 16))),
    ("b", TensorType(i32, ("M",))),
    ("m", TensorType(i1, ("N",))),
    ("s", ScalarType(f32)),
    ("n", ScalarType(i32)),
    ("f", ScalarType(i1)),
]


def args(M: int = 40, N: int = 3) -> list:
    return [torch.zeros(M, 16, dtype=torch.bfloat16), torch.zeros(M, dtype=torch.int32),
            torch.zeros(N, dtype=torch.bool), 0.5, 2, True]


def test_bind_returns_dims():
    assert signature.bind("k", PARAMS, args(M=40, N=3), numpy_ok=False) == {"M": 40, "N": 3}


@pytest.mark.parametrize("index,value,message", [
    (None, None, r"^error: kernel @k takes 6 arguments \(a, b, m, s, n, f\), got 5$"),
    (0, torch.zeros(40, dtype=torch.bfloat16),
     r"^error: a: expected rank 2 for tensor<bf16\[M, 16\]>, got shape \(40,\)$"),
    (0, torch.zeros(40, 16), r"^error: a: expected a tensor of dtype bf16, got torch.float32$"),
    (1, torch.zeros(40, dtype=torch.int64), r"^error: b: expected a tensor of dtype i32, got torch.int64$"),
    (0, np.zeros((40, 16), np.float32),
     r"^error: a: expected tensor<bf16\[M, 16\]> \(a torch tensor\), got ndarray$"),
    (0, torch.zeros(40, 8, dtype=torch.bfloat16), r"^error: a: axis 1 must have size 16, got 8 \(shape \(40, 8\)\)$"),
    (1, torch.zeros(96, dtype=torch.int32), r"^error: dim M is 40 from a \(axis 0\) but 96 from b \(axis 0\)$"),
    (3, "x", r"^error: s: expected a scalar of type f32, got str 'x'$"),
    (3, True, r"^error: s: expected a scalar of type f32, got bool True$"),
    (3, torch.tensor(1.0), r"^error: s: expected a scalar of type f32, got Tensor$"),
    (4, 2.0, r"^error: n: expected a scalar of type i32, got float 2.0$"),
    (3, 10**400, r"^error: s: an integer of 401 digits is out of the range of a float"),
    (3, 1e39, r"^error: s: 1e\+39 is out of f32's range: it would round to infinity$"),
    (3, -10**39, r"^error: s: -1000000000000000000000000000000000000000 is out of f32's range"),
    (4, 2**31, r"^error: n: 2147483648 does not fit in i32$"),
    (4, -(2**31) - 1, r"^error: n: -2147483649 does not fit in i32$"),
    (5, 1, r"^error: f: expected a scalar of type bool, got int 1$"),
    (0, torch.zeros(40, 16, dtype=torch.bfloat16).to_sparse(),
     r"^error: a: a sparse_coo tensor; kernels take dense tensors \(pass a.to_dense\(\)\)$"),
    # an expanded view: its elements along axis 0 share memory (a kernel writing it races with itself)
    (0, torch.zeros(1, 16, dtype=torch.bfloat16).expand(40, 16),
     r"^error: a: axis 0 has stride 0 \(an expanded view, whose 40 elements there share one place in memory\); "
     r"kernels take tensors whose elements each have their own: pass a.contiguous\(\)$"),
])
def test_signature_errors(index, value, message):
    a = args()
    if index is None:
        a.pop()
    else:
        a[index] = value
    with pytest.raises(TkcLaunchError, match=message):
        check_launch("k", PARAMS, a, device=CUDA0)


def test_numpy_and_bool_scalars_accepted_by_bind():
    a = args()
    a[3:] = [np.float32(0.25), np.int32(-7), np.bool_(False)]
    assert signature.bind("k", PARAMS, a, numpy_ok=False) == {"M": 40, "N": 3}


def test_same_messages_as_the_interpreter():
    kernel = parse_module("""
tile.kernel @k {
^(%a: tensor<f32[M, K]>, %b: tensor<f32[K, N]>, %c: tensor<f32[M, N]>):
  %c1 = tile.constant {value = 1} : i32
  tile.grid %c1
  tile.return
}""", "t.tkir").kernel()
    params = signature.kernel_params(kernel)
    assert [n for n, _ in params] == ["a", "b", "c"]
    bad = [torch.zeros(128, 32), torch.zeros(32, 64), torch.zeros(96, 64)]
    with pytest.raises(TkcLaunchError) as gpu:
        check_launch("k", params, bad, device=CUDA0)
    with pytest.raises(TkcLaunchError) as interp:
        run_kernel(kernel, bad)
    assert gpu.value.message == interp.value.message == "dim M is 128 from a (axis 0) but 96 from c (axis 0)"


def test_cpu_tensor_rejected_after_the_signature():
    with pytest.raises(TkcLaunchError, match=r"^error: a: expected a CUDA tensor, got a tensor on cpu$"):
        check_launch("k", PARAMS, args(), device=CUDA0)


def test_devices():
    check_devices([("a", torch.device("cuda", 1)), ("b", torch.device("cuda"))], torch.device("cuda", 1))
    with pytest.raises(TkcLaunchError, match=r"^error: b: is on cuda:1 but the kernel runs on cuda:0 "):
        check_devices([("a", CUDA0), ("b", torch.device("cuda", 1))], CUDA0)
    with pytest.raises(TkcLaunchError, match=r"^error: a: expected a CUDA tensor, got a tensor on meta$"):
        check_devices([("a", torch.device("meta"))], CUDA0)


def _layout(t: torch.Tensor, tma: bool = False, name: str = "x") -> None:
    check_layout(name, tuple(t.shape), tuple(t.stride()), t.element_size(), t.data_ptr(), tma)


def test_layout_ok():
    base = torch.zeros(64, 72, dtype=torch.bfloat16)
    _layout(base, tma=True)
    _layout(base[:, :70], tma=True)  # padded rows: 144-B stride
    _layout(base[:8], tma=True)
    _layout(torch.zeros(5, 1).expand(5, 1))  # size-1 innermost: any stride
    _layout(torch.zeros(0, 3).t())  # empty: never dereferenced


def test_layout_errors():
    t = torch.zeros(64, 64)
    with pytest.raises(TkcLaunchError, match=r"^error: x: the innermost dim must be contiguous \(stride 1\), "
                                             r"got strides \(1, 64\) for shape \(64, 64\); pass .contiguous\(\)$"):
        _layout(t.t())
    with pytest.raises(TkcLaunchError, match=r"^error: x: axis 0 has a negative stride \(-1\)$"):
        check_layout("x", (4, 1), (-1, 1), 4, 0)
    with pytest.raises(TkcLaunchError, match=r"^error: x: the data pointer 0x[0-9a-f]+ is not 16-byte aligned "
                                             r"\(a view at an offset of 4 bytes\?\); pass .clone\(\)$"):
        _layout(t.view(-1)[1:])
    odd = torch.zeros(64, 70, dtype=torch.bfloat16)
    _layout(odd)  # fine without TMA
    with pytest.raises(TkcLaunchError, match=r"^error: x: axis 0 has a stride of 140 bytes; TMA needs outer "
                                             r"strides that are multiples of 16 bytes \(compile with the pin "
                                             r"tma=False to load it without TMA, or tma_vectors=False where "
                                             r"that pin is set and it is a row vector\)$"):
        _layout(odd, tma=True)


def test_launch_without_gpu_is_a_clean_error():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(TkcLaunchError, match=r"no CUDA device is available to torch"):
        check_launch("k", PARAMS, args())
