"""Textual IR round trip: ``print(parse(print(m))) == print(m)`` for random valid modules.

The modules come from ``ir_strategies.modules()``, which builds them with ``Builder`` from a
random mix of tile-dialect ops (see that file).  Beyond the text being a fixed point, the
reparsed module must verify, have the same ops in the same order with the same result types,
the same attribute values (NaN matching NaN, -0.0 distinct from 0.0, int distinct from float
and bool) and, when locations were printed, the same locations.  Every ``.tkir`` file under
``tests/`` and ``examples/`` must round-trip as well.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from tkc.dtypes import bf16, f32
from tkc.errors import TkcVerifyError, Loc
from tkc.ir.core import OPS, Block, Module, Region
import tkc.ir.dialects  # noqa: F401  (registers every op kind in OPS)
from tkc.ir.dialects import tile as T
from tkc.ir.parser import parse_module
from tkc.ir.printer import print_module
from tkc.ir.types import TensorType, TileType
from tkc.ir.verifier import verify

from .ir_strategies import I1, I32, modules

REPO = Path(__file__).resolve().parents[2]
TKIR_FILES = sorted({p for d in ("tests", "examples") for p in (REPO / d).glob("**/*.tkir")})

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ----------------------------------------------------------------- helpers
def attr_equal(a: object, b: object) -> bool:
    """Structural equality of attribute values where NaN equals NaN, -0.0 differs from 0.0
    and 1, 1.0 and True are three different values."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)
    if isinstance(a, list):
        return len(a) == len(b) and all(attr_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(attr_equal(a[k], b[k]) for k in a)
    return a == b


def same_loc(a: Loc, b: Loc) -> bool:
    return (a.file, a.line, a.col) == (b.file, b.line, b.col)


def check_same_structure(m1: Module, m2: Module, locs: bool) -> None:
    ops1, ops2 = list(m1.walk()), list(m2.walk())
    assert len(ops1) == len(ops2)
    for o1, o2 in zip(ops1, ops2):
        assert type(o1) is type(o2)
        assert [r.type for r in o1.results] == [r.type for r in o2.results]
        assert len(o1.operands) == len(o2.operands)
        assert [[a.type for a in r.block.args] for r in o1.regions] == \
               [[a.type for a in r.block.args] for r in o2.regions]
        assert attr_equal(o1.attributes, o2.attributes), (o1.attributes, o2.attributes)
        if locs:
            assert same_loc(o1.loc, o2.loc), (o1.loc, o2.loc)


def check_operand_wiring(m1: Module, m2: Module) -> None:
    """Each operand refers to the same definition (op index, result index or block arg)."""

    def positions(m: Module) -> list[tuple]:
        where: dict[object, tuple] = {}
        out = []
        for i, op in enumerate(m.walk()):
            for r in op.results:
                where[r] = ("result", i, r.index)
            for j, region in enumerate(op.regions):
                for a in region.block.args:
                    where[a] = ("arg", i, j, a.index)
        for op in m.walk():
            out.append([where[v] for v in op.operands])
        return out

    assert positions(m1) == positions(m2)


def roundtrip(m: Module, locs: bool) -> None:
    text = print_module(m, locs=locs)
    m2 = parse_module(text, "roundtrip.tkir")
    verify(m2)
    assert print_module(m2, locs=locs) == text
    check_same_structure(m, m2, locs)
    check_operand_wiring(m, m2)
    # Printing the other way round is a fixed point too.
    other = print_module(m2, locs=not locs)
    assert print_module(parse_module(other, "other.tkir"), locs=not locs) == other


# ------------------------------------------------------------------ tests
def _collision_module() -> Module:
    """Hints that collide with each other and with the names the printer generates:
    an unnamed value takes "0", so a value hinted "0" becomes "0_1" (which must then
    still print as "0_1" after reparsing), and "x", "x", "x_1" must stay distinct."""
    block = Block()
    k = T.KernelOp([], [], {"sym_name": "k"}, [Region([block])])
    vals = []
    for hint in [None, "0", "0", "x", "x", "x_1", "1_1", "", "a b", None]:
        v = T.ConstantOp([], [I32], {"value": 1}).result
        v.name_hint = hint
        block.append(v.owner)
        vals.append(v)
    block.append(T.ConstantOp([], [I1], {"value": True}))
    block.append(T.ReturnOp([], []))
    m = Module([k])
    verify(m)
    return m


@SETTINGS
@given(modules())
@example(_collision_module())
def test_roundtrip(m: Module) -> None:
    roundtrip(m, locs=True)
    roundtrip(m, locs=False)


ALL_OPS = sorted(name for name in OPS if name.startswith("tile."))


@pytest.mark.parametrize("name", ALL_OPS)
@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow],
          phases=[Phase.explicit, Phase.reuse, Phase.generate])  # 44 tests: shrink in test_roundtrip
@given(data=st.data())
def test_roundtrip_of_every_op_kind(name: str, data: st.DataObject) -> None:
    """The random mix above may miss a rare op kind; here each kind is in every module."""
    m = data.draw(modules(require=name))
    roundtrip(m, locs=True)
    roundtrip(m, locs=False)


def test_colliding_hints_keep_their_printed_names() -> None:
    text = print_module(_collision_module(), locs=False)
    for name in ("%0 ", "%0_1 ", "%0_2 ", "%x ", "%x_1 ", "%x_1_1 ", "%1_1 "):
        assert f"  {name}= tile.constant" in text, text
    assert print_module(parse_module(text), locs=False) == text


@pytest.mark.parametrize("value, text", [
    (float("nan"), "nan"), (float("inf"), "inf"), (float("-inf"), "-inf"), (-0.0, "-0.0"),
    (1e-20, "1e-20"), (-1e-20, "-1e-20"), (1e300, "1e+300"), (5e-324, "5e-324"), (0.1, "0.1"),
    (3, "3"), (-(2**31), "-2147483648"), (True, "true"), (False, "false"),
])
def test_constant_attribute_values(value: object, text: str) -> None:
    dt = "i1" if isinstance(value, bool) else "f32"
    src = f"tile.kernel @k {{\n  %c = tile.constant {{value = {text}}} : {dt}\n  tile.return\n}}\n"
    m = parse_module(src)
    verify(m)
    got = next(op for op in m.walk() if op.name == "tile.constant").value
    assert attr_equal(got, value)
    assert print_module(m, locs=False) == src


def test_tkir_files_exist() -> None:
    assert TKIR_FILES, "expected at least tests/ir/data/gemm.tkir"


@pytest.mark.parametrize("path", TKIR_FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_tkir_file_roundtrips(path: Path) -> None:
    text = path.read_text()
    m = parse_module(text, str(path))
    verify(m)
    for locs in (True, False):
        printed = print_module(m, locs=locs)
        m2 = parse_module(printed, str(path))
        verify(m2)
        assert print_module(m2, locs=locs) == printed
        check_same_structure(m, m2, locs)


def test_ops_without_loc_get_their_tkir_position() -> None:
    text = "tile.kernel @k {\n  %c = tile.constant {value = 1} : i32\n    tile.return\n}\n"
    ops = list(parse_module(text, "f.tkir").walk())
    assert [(o.loc.file, o.loc.line, o.loc.col) for o in ops] == [
        ("f.tkir", 1, 1), ("f.tkir", 2, 3), ("f.tkir", 3, 5)]


def test_tensor_params_and_odd_locations_roundtrip() -> None:
    block = Block([TensorType(bf16, ("M", 64, "Ñ")), TensorType(f32, ())], ["a", "a"])
    k = T.KernelOp([], [], {"sym_name": "k", "consts": {}}, [Region([block])],
                   Loc('we"ird \\ fïle\n🚀', 7, 9))
    block.append(T.ReturnOp([], [], loc=Loc("", 0, 0)))
    m = Module([k])
    verify(m)
    roundtrip(m, locs=True)
    roundtrip(m, locs=False)


# --------------------------------------------------- known gaps (verify passes, text does not)
def _kernel_module(name: str = "k", consts: dict | None = None) -> tuple[Module, Block]:
    block = Block()
    attrs: dict = {"sym_name": name} | ({"consts": consts} if consts is not None else {})
    return Module([T.KernelOp([], [], attrs, [Region([block])])]), block


def _gap_modules() -> list[tuple[str, Module]]:
    out = []
    for label, name, consts in [("sym-with-space", "a b", None), ("empty-sym", "", None),
                                ("consts-key-with-space", "k", {"a b": 1}), ("consts-none", "k", {"a": None}),
                                ("consts-key-with-dollar", "k", {"a$b": 1}),
                                ("nested-key-with-dollar", "k", {"a": [{"$": 1}]})]:
        m, block = _kernel_module(name, consts)
        block.append(T.ReturnOp([], []))
        out.append((label, m))
    m, block = _kernel_module()
    block.append(T.ConstantOp([], [TileType((), f32)], {"value": 1.0}))
    block.append(T.ReturnOp([], []))
    out.append(("rank-0-tile", m))
    return out


@pytest.mark.parametrize("label, m", _gap_modules(), ids=[g[0] for g in _gap_modules()])
def test_modules_without_a_textual_form_do_not_verify(label: str, m: Module) -> None:
    # Non-identifier symbols and keys, None attributes and rank-0 tiles would print as text the
    # parser rejects; the verifier refuses them so that every verified module round-trips.
    with pytest.raises(TkcVerifyError):
        verify(m)
