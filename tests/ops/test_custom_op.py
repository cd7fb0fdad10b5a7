"""tkc.ops.custom_op: a kernel's signature and tile IR make the operator's schema, roles,
fake implementation and results (run in the interpreter on CPU tensors)."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import tkc  # noqa: E402
import tkc.ops  # noqa: E402
from tkc.errors import TkcLaunchError, TkcUsageError  # noqa: E402
from tkc.ops.kernel_op import INPUT, MUTATED, OUTPUT, ZEROED, roles  # noqa: E402

import op_kernels as k  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="module")
def ops() -> dict:
    """The test kernels as operators of the namespace tkctest (registered once a process)."""
    return {
        "axpy": tkc.ops.custom_op("tkctest::axpy", k.axpy),
        "axpy_inplace": tkc.ops.custom_op("tkctest::axpy_inplace", k.axpy_inplace),
        "col_sums": tkc.ops.custom_op("tkctest::col_sums", k.col_sums),
        "scaled": tkc.ops.custom_op("tkctest::scaled", k.scaled, consts={"k": 3}, const_args=("negate",)),
        "gemm": tkc.ops.custom_op("tkctest::gemm", tkc.load(EXAMPLES / "gemm.tk"), consts={"BM": 64, "BN": 64}),
    }


def test_roles_come_from_the_tile_ir() -> None:
    assert roles(k.axpy.lower().kernel("axpy")) == [INPUT, INPUT, OUTPUT, INPUT]
    assert roles(k.axpy_inplace.lower().kernel("axpy_inplace")) == [INPUT, MUTATED, INPUT]
    assert roles(k.col_sums.lower().kernel("col_sums")) == [INPUT, ZEROED]


def test_schemas(ops: dict) -> None:
    def schema(name: str) -> str:
        return str(getattr(torch.ops.tkctest, name).default._schema)

    assert schema("axpy") == "tkctest::axpy(Tensor x, Tensor y, float a) -> Tensor"
    assert schema("axpy_inplace") == "tkctest::axpy_inplace(Tensor x, Tensor(a!) y, float a) -> ()"
    assert schema("col_sums") == "tkctest::col_sums(Tensor x) -> Tensor"
    assert schema("scaled") == "tkctest::scaled(Tensor x, *, bool negate=False) -> Tensor"
    assert schema("gemm") == "tkctest::gemm(Tensor a, Tensor b) -> Tensor"


def test_outputs_inputs_and_mutation(ops: dict) -> None:
    x, y = torch.randn(77), torch.randn(77)
    torch.testing.assert_close(torch.ops.tkctest.axpy(x, y, 0.5), 0.5 * x + y)
    want = 2.0 * x + y
    assert torch.ops.tkctest.axpy_inplace(x, y, 2.0) is None
    torch.testing.assert_close(y, want)
    m = torch.randn(10, 45)
    torch.testing.assert_close(ops["col_sums"](m), m.sum(0), atol=1e-5, rtol=1e-5)  # starts at zero


def test_const_args_specialize_per_call(ops: dict) -> None:
    x = torch.randn(40)
    torch.testing.assert_close(ops["scaled"](x), 3 * x)
    torch.testing.assert_close(ops["scaled"](x, negate=True), -3 * x)


def test_a_tk_file_kernel_in_a_user_namespace(ops: dict) -> None:
    a = torch.randn(70, 40).to(torch.bfloat16)
    b = torch.randn(40, 24).to(torch.bfloat16)
    got = torch.ops.tkctest.gemm(a, b)
    torch.testing.assert_close(got.float(), a.float() @ b.float(), atol=2e-2, rtol=2e-2)


def test_opcheck(ops: dict) -> None:
    x, y = torch.randn(40), torch.randn(40)
    torch.library.opcheck(ops["axpy"], (x, y, 0.5))
    torch.library.opcheck(ops["axpy_inplace"], (x, y.clone(), 0.5))
    torch.library.opcheck(ops["col_sums"], (torch.randn(6, 40),))
    torch.library.opcheck(ops["scaled"], (x,), {"negate": True})


def test_compiles_without_graph_breaks(ops: dict) -> None:
    def f(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        z = torch.ops.tkctest.axpy(x, y, 2.0).relu()
        return torch.ops.tkctest.scaled(z, negate=True) + 1

    x, y = torch.randn(50), torch.randn(50)
    explained = torch._dynamo.explain(f)(x, y)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    torch._dynamo.reset()
    got = torch.compile(f, fullgraph=True, backend="aot_eager")(x, y)
    torch.testing.assert_close(got, -3 * (2 * x + y).relu() + 1)


def test_wrong_inputs_are_tkc_errors_in_the_fake_implementation_too(ops: dict) -> None:
    x = torch.randn(40)
    with pytest.raises(TkcLaunchError, match="dim N is 40 from x"):
        ops["axpy"](x, torch.randn(41), 1.0)
    with pytest.raises(TkcLaunchError, match="expected a tensor of dtype f32"):
        ops["axpy"](x, x.double(), 1.0)
    with torch._subclasses.fake_tensor.FakeTensorMode() as mode:
        fx = mode.from_tensor(x)
        assert ops["axpy"](fx, fx, 1.0).shape == (40,)
        with pytest.raises(TkcLaunchError, match="expected rank 1"):
            ops["axpy"](fx, mode.from_tensor(torch.randn(4, 10)), 1.0)
        # an axis past i32, refused before any kernel would index it (nothing is allocated)
        big = torch.empty(2**31, device="meta")
        with pytest.raises(TkcLaunchError, match="x: axis 0 has 2147483648 elements; tkc kernels index with i32"):
            ops["axpy"](mode.from_tensor(big), mode.from_tensor(big), 1.0)


def test_registration_errors() -> None:
    with pytest.raises(TkcUsageError, match="'namespace::name'"):
        tkc.ops.custom_op("axpy", k.axpy)
    with pytest.raises(TkcUsageError, match="takes a @tkc.kernel"):
        tkc.ops.custom_op("tkctest::nope", lambda x: x)
    with pytest.raises(TkcUsageError, match="is not a constant of kernel 'axpy'"):
        tkc.ops.custom_op("tkctest::axpy_bad", k.axpy, const_args=("BK",))
    with pytest.raises(TkcUsageError, match=r"output y: tensor<f32\[P\]> has dims \(P\) that no input"):
        tkc.ops.custom_op("tkctest::fill", k.fill)
    # torch would replace an operator of that name silently (tkc.ops.rms_norm then failed on
    # the new schema, without a word of why)
    assert tkc.ops.rms_norm is not None  # (tkc.ops registered tkc::rms_norm when imported)
    for taken in ("tkc::rms_norm", "aten::add"):
        with pytest.raises(TkcUsageError, match=f"{taken} is already an operator"):
            tkc.ops.custom_op(taken, k.axpy)


def test_an_output_dim_no_input_has_is_sized_by_dims_and_zeroed() -> None:
    """``dims`` sizes P from the inputs' dims (varlen attention's padded lse); ``zeroed`` makes
    the elements the kernel leaves unwritten zeros, in eager calls and under torch.compile."""
    op = tkc.ops.custom_op("tkctest::padded", k.padded, dims={"P": lambda d: d["N"] + 64}, zeroed=("y",))
    x = torch.randn(40)
    y = op(x)
    assert y.shape == (104,) and torch.equal(y[:40], x * 2) and not y[40:].any()
    compiled = torch.compile(lambda x: op(x) + 1, fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(x), y + 1)
    with pytest.raises(TkcUsageError, match=r"zeroed= names yy, which is not an output of the operator \(its "
                                            r"outputs: y\)"):
        tkc.ops.custom_op("tkctest::padded_zy", k.padded, dims={"P": lambda d: d["N"]}, zeroed=("yy",))
    with pytest.raises(TkcUsageError, match="dims= names N, which is not a dim of an output that no input has"):
        tkc.ops.custom_op("tkctest::padded_n", k.padded, dims={"P": lambda d: d["N"], "N": lambda d: 3})
    bad = tkc.ops.custom_op("tkctest::padded_m", k.padded, dims={"P": lambda d: d["M"]})
    with pytest.raises(TkcUsageError, match="dims=\\{'P': ...\\} reads dim 'M', which no input has"):
        bad(x)


def test_accumulates_takes_an_accumulator_as_a_mutated_argument() -> None:
    """``accumulates``: a tensor the kernel only adds to is the caller's, updated in place (an
    accumulator another operator zeroed, as attention's dQ), not an output made of zeros."""
    op = tkc.ops.custom_op("tkctest::col_sums_into", k.col_sums, accumulates=("s",))
    assert str(torch.ops.tkctest.col_sums_into.default._schema) == \
        "tkctest::col_sums_into(Tensor x, Tensor(a!) s) -> ()"
    m, s = torch.randn(6, 40), torch.full((40,), 2.0)
    assert op(m, s) is None
    torch.testing.assert_close(s, m.sum(0) + 2, atol=1e-5, rtol=1e-5)  # added to what was there
    compiled = torch.compile(lambda m, s: op(m, s), fullgraph=True, backend="aot_eager")
    s2 = torch.zeros(40)
    compiled(m, s2)
    torch.testing.assert_close(s2, m.sum(0), atol=1e-5, rtol=1e-5)
    with pytest.raises(TkcUsageError, match="accumulates= names x, which kernel 'col_sums' does not only add "
                                            "to atomically"):
        tkc.ops.custom_op("tkctest::col_sums_x", k.col_sums, accumulates=("x",))


def test_load_names_a_kernel_of_a_tk_file(tmp_path: Path) -> None:
    assert tkc.load(EXAMPLES / "gemm.tk").params == ["a", "b", "c", "BM", "BN", "BK"]
    with pytest.raises(TkcUsageError, match="has no kernel 'nope' \\(its kernels: gemm\\)"):
        tkc.load(EXAMPLES / "gemm.tk", "nope")
    with pytest.raises(TkcUsageError, match="cannot read"):
        tkc.load(tmp_path / "missing.tk")


def test_const_args_is_a_sequence_of_names_and_load_reads_tk_files() -> None:
    from tkc.ops.kernels.rmsnorm import rmsnorm

    with pytest.raises(TkcUsageError, match=r"const_args is a sequence of constants' names, e.g. \('BN',\)"):
        tkc.ops.custom_op("tkc_test::one_string", rmsnorm, const_args="BN")
    rms_py = Path(__file__).parents[2] / "examples" / "rmsnorm.py"
    with pytest.raises(TkcUsageError, match="tkc.load reads .tk files; .*rmsnorm.py is Python"):
        tkc.load(rms_py)


DEPENDENT = """@kernel
def scale(x: f32[N], y: f32[N], k: const = 2, factor: const = k * 10, BN: const = 32):
    grid(cdiv(N, BN))
    i = program_id(0) * BN
    y[i:i+BN] = x[i:i+BN] * factor
"""


def test_a_default_that_reads_a_const_arg_follows_the_call(tmp_path: Path) -> None:
    """factor = k * 10 is the kernel's for the call's k, not fixed at the registration's."""
    (tmp_path / "dep.tk").write_text(DEPENDENT)
    op = tkc.ops.custom_op("tkctest::dependent", tkc.load(tmp_path / "dep.tk"), const_args=("k",))
    x = torch.ones(8)
    torch.testing.assert_close(op(x), 20 * x)
    torch.testing.assert_close(op(x, k=5), 50 * x)


def test_the_attention_backward_gets_the_kernels_pins_for_its_head_dim() -> None:
    """attn_train.tk's attn_bwd turns overlap_products and refill_first on at D = 128 only (at
    D = 64 they spill): the operator must not carry D = 128's into a D = 64 call."""
    from tkc.ops.attention import _bwd

    impl = _bwd.tkc_impl
    d64 = impl.spec({"D": 64, "BM": 128, "BN": 128, "causal": True}).run_consts
    d128 = impl.spec({"D": 128, "BM": 64, "BN": 128, "causal": False}).run_consts
    assert "overlap_products" not in d64 and "refill_first" not in d64
    assert impl.kernel.lower(**d64).kernel("attn_bwd").attributes["consts"]["overlap_products"] is False
    assert impl.kernel.lower(**d128).kernel("attn_bwd").attributes["consts"]["overlap_products"] is True
