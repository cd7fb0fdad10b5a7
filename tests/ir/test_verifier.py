"""``verify`` rejects ill-typed IR with a TkcVerifyError that says why and points at the op.

Most cases are textual IR: a kernel with a fixed prelude of values, plus the op under test on
a line marked ``// bad``; the error must be located on that line and its message must start
with the name of the op that reports it.  What the parser cannot express (a use before the
definition, a value used outside its region, an unregistered op kind, broken structure) is
built with ``Builder``.  Every registered op kind has at least one case.
"""

from __future__ import annotations

import re

import pytest

from tkc.dtypes import bf16, f16, f32, i1, i32
from tkc.errors import Loc, TkcVerifyError
from tkc.ir.builder import Builder
from tkc.ir.core import OPS, Block, Module, Operation, Region
from tkc.ir.dialects import tile as T
from tkc.ir.parser import parse_module
from tkc.ir.types import ScalarType, TileType
from tkc.ir.verifier import verify

I32 = ScalarType(i32)
F32 = ScalarType(f32)

PARAMS = "^(%t: tensor<f32[M, 64]>, %h: tensor<f16[M, N]>, %s: f32, %n: i32, %p: i1, %tb: tensor<i1[4]>):"
RANKS_PARAMS = "^(%t: tensor<f32[M, 64]>, %g: tensor<i32[4] @ranks>):"
PRELUDE = """\
  %f = tile.constant {value = 1.0} : f32
  %i = tile.constant {value = 1} : i32
  %c = tile.constant {value = true} : i1
  %t4 = tile.constant {value = 1.0} : tile<4x4xf32>
  %t48 = tile.constant {value = 1.0} : tile<4x8xf32>
  %h4 = tile.constant {value = 1.0} : tile<4x4xf16>
  %b4 = tile.constant {value = 1.0} : tile<4x4xbf16>
  %e4 = tile.constant {value = 1.0} : tile<4x4xf8e4m3>
  %i4 = tile.constant {value = 1} : tile<4x4xi32>
  %c4 = tile.constant {value = true} : tile<4x4xi1>
  %v4 = tile.constant {value = 1.0} : tile<4xf32>
  %r14 = tile.constant {value = 1.0} : tile<1x4xf32>
"""


def kernel(body: str, params: str = PARAMS, header: str = "tile.kernel @k", ret: bool = True) -> str:
    body = "\n".join("  " + line for line in body.strip("\n").splitlines())
    return f"{header} {{\n{params}\n{PRELUDE}{body}\n" + ("  tile.return\n" if ret else "") + "}\n"


#: Operands of dot_scaled: a [4, 32], b [32, 4] and their scales (one per 32 values along K).
_SCALED = """\
%a = tile.constant {value = 1.0} : tile<4x32xf8e4m3>
%ha = tile.constant {value = 1.0} : tile<4x32xf16>
%b = tile.constant {value = 1.0} : tile<32x4xf8e5m2>
%sa = tile.constant {value = 1.0} : tile<4x1xf8e8m0>
%fa = tile.constant {value = 1.0} : tile<4x1xf32>
%sb = tile.constant {value = 1.0} : tile<1x4xf8e8m0>
"""

# (op kind under test, body or whole text, message regex, op that reports it when not the kind)
CASES: list[tuple[str, str, str, str | None]] = [
    # ----------------------------------------------------------------- tile.kernel
    ("tile.kernel", "tile.kernel @k { // bad\n  %x = tile.constant {value = 1} : i32\n}\n",
     r"must end with a terminator", None),
    ("tile.kernel", "tile.kernel @k {\n  %x = tile.constant {value = true} : i1\n"
                    "  tile.if %x {\n    tile.return // bad\n  } {\n    tile.return\n  }\n}\n",
     r"'tile.return' ends a kernel body only", "tile.return"),
    ("tile.kernel", "tile.kernel @k { // bad\n^(%x: tile<4xf32>):\n  tile.return\n}\n",
     r"kernel parameters are tensors or scalars, got tile<4xf32>", None),
    ("tile.kernel", "tile.kernel {consts = {}} { // bad\n  tile.return\n}\n",
     r"missing attribute 'sym_name'", None),
    ("tile.kernel", "tile.kernel @k {consts = 3} { // bad\n  tile.return\n}\n",
     r"attribute 'consts' must be dict, got 3", None),
    ("tile.kernel", "tile.kernel @k {constz = {}} { // bad\n  tile.return\n}\n",
     r"unknown attribute 'constz'", None),
    ("tile.kernel", "tile.kernel @k { // bad\n  tile.return\n} {\n  tile.return\n}\n",
     r"expects 1 regions, has 2", None),
    ("tile.kernel", kernel("%x = tile.constant {value = 4} : i32\ntile.grid %x\ntile.grid %x // bad"),
     r"at most one launch grid", "tile.grid"),
    # ----------------------------------------------------------------- tile.return
    ("tile.return", kernel("tile.return // bad\n%x = tile.constant {value = 4} : i32"),
     r"terminator is not the last op of its block", None),
    ("tile.return", kernel("tile.return %i // bad", ret=False), r"takes 0 operands, got 1", None),
    ("tile.return", kernel("tile.for %i, %i, %i {\n^(%k: i32):\n  tile.return // bad\n}"),
     r"ends a kernel body only", None),
    # ------------------------------------------------------------------ tile.yield
    ("tile.yield", kernel("%r = tile.for %i, %i, %i, %i : i32 {\n^(%k: i32, %a: i32):\n"
                          "  tile.yield %f // bad\n}"),
     r"yields \(f32\) but 'tile.for' results are \(i32\)", None),
    ("tile.yield", kernel("%r = tile.if %c : f32 {\n  tile.yield %f\n} {\n  tile.yield %f, %f // bad\n}"),
     r"yields \(f32, f32\) but 'tile.if' results are \(f32\)", None),
    ("tile.yield", kernel("tile.yield // bad", ret=False), r"ends a 'tile.for', 'tile.if' or 'hopper.role' region only",
     None),
    ("tile.yield", kernel("tile.for %i, %i, %i {\n^(%k: i32):\n  tile.yield // bad\n"
                          "  %x = tile.constant {value = 4} : i32\n  tile.yield\n}"),
     r"terminator is not the last op of its block", None),
    # ------------------------------------------------------------------- tile.grid
    ("tile.grid", kernel("tile.grid %i, %i, %i, %i // bad"), r"takes 1 to 3 extents", None),
    ("tile.grid", kernel("tile.grid // bad"), r"takes 1 to 3 extents", None),
    ("tile.grid", kernel("tile.grid %i, %f // bad"), r"grid extents are i32 scalars", None),
    # -------------------------------------------------------------------- tile.for
    ("tile.for", kernel("tile.for %i, %f, %i { // bad\n^(%k: i32):\n  tile.yield\n}"),
     r"loop bounds and step are i32 scalars", None),
    ("tile.for", kernel("tile.for %i, %i { // bad\n^(%k: i32):\n  tile.yield\n}"),
     r"takes at least 3 operands, got 2", None),
    ("tile.for", kernel("%r = tile.for %i, %i, %i, %f : i32 { // bad\n^(%k: i32, %a: i32):\n"
                        "  tile.yield %a\n}"),
     r"result types must match the carried values' types", None),
    ("tile.for", kernel("%r = tile.for %i, %i, %i, %f : f32 { // bad\n^(%k: f32, %a: f32):\n"
                        "  tile.yield %a\n}"),
     r"body arguments must be \(i32 induction variable, carried values...\)", None),
    ("tile.for", kernel("tile.for %i, %i, %i { // bad\n^(%k: i32):\n"
                        "  %x = tile.constant {value = 4} : i32\n}"),
     r"a region's block must end with a terminator", None),
    ("tile.for", kernel("tile.for %i, %i, %i // bad"), r"expects 1 regions, has 0", None),
    # --------------------------------------------------------------------- tile.if
    ("tile.if", kernel("tile.if %f { // bad\n  tile.yield\n} {\n  tile.yield\n}"),
     r"condition must be an i1 scalar, got f32", None),
    ("tile.if", kernel("tile.if %c4 { // bad\n  tile.yield\n} {\n  tile.yield\n}"),
     r"condition must be an i1 scalar, got tile<4x4xi1>", None),
    ("tile.if", kernel("tile.if %c { // bad\n  tile.yield\n}"), r"expects 2 regions, has 1", None),
    ("tile.if", kernel("tile.if %c { // bad\n^(%z: i32):\n  tile.yield\n} {\n  tile.yield\n}"),
     r"branches take no arguments", None),
    # ------------------------------------------------------------ ids, dims, consts
    ("tile.program_id", kernel("%x = tile.program_id {axis = 3} : i32 // bad"),
     r"axis must be 0, 1 or 2", None),
    ("tile.program_id", kernel("%x = tile.program_id {axis = 0} : f32 // bad"),
     r"the result i32", None),
    ("tile.program_id", kernel("%x = tile.program_id : i32 // bad"), r"missing attribute 'axis'", None),
    ("tile.program_id", kernel("%x = tile.program_id {axis = true} : i32 // bad"),
     r"attribute 'axis' must be int, got True", None),
    ("tile.program_id", kernel("%x = tile.program_id {axis = 0.0} : i32 // bad"),
     r"attribute 'axis' must be int, got 0.0", None),
    ("tile.program_id", kernel("%x = tile.program_id {axis = 0, dim = 1} : i32 // bad"),
     r"unknown attribute 'dim'", None),
    ("tile.program_id", kernel("tile.program_id {axis = 0} // bad"), r"expects 1 results, has 0", None),
    ("tile.num_programs", kernel("%x = tile.num_programs {axis = -1} : i32 // bad"),
     r"axis must be 0, 1 or 2", None),
    ("tile.num_programs", kernel("%x = tile.num_programs %i {axis = 0} : i32 // bad"),
     r"takes 0 operands, got 1", None),
    ("tile.num_sms", kernel("%x = tile.num_sms : f32 // bad"), r"the result is an i32", None),
    ("tile.dim", kernel("%x = tile.dim %t {axis = 2} : i32 // bad"),
     r"axis 2 is not an axis of tensor<f32\[M, 64\]>", None),
    ("tile.dim", kernel("%x = tile.dim %s {axis = 0} : i32 // bad"), r"axis 0 is not an axis of f32", None),
    ("tile.dim", kernel("%x = tile.dim %t {axis = 0} : f32 // bad"), r"result must be i32", None),
    ("tile.dim", kernel('%x = tile.dim %t {axis = "0"} : i32 // bad'),
     r"attribute 'axis' must be int, got '0'", None),
    ("tile.constant", kernel("%x = tile.constant {value = 1} : i1 // bad"),
     r"an i1 constant takes true or false", None),
    ("tile.constant", kernel("%x = tile.constant {value = 1.5} : i32 // bad"),
     r"an integer constant takes an integer value", None),
    ("tile.constant", kernel("%x = tile.constant {value = true} : tile<4xi32> // bad"),
     r"an integer constant takes an integer value", None),
    ("tile.constant", kernel("%x = tile.constant {value = 1} : tensor<i32[4]> // bad"),
     r"result must be a scalar or tile, got tensor<i32\[4\]>", None),
    ("tile.constant", kernel('%x = tile.constant {value = "1"} : i32 // bad'),
     r"attribute 'value' must be int or float or bool, got '1'", None),
    ("tile.constant", kernel("%x = tile.constant {value = [1]} : i32 // bad"),
     r"attribute 'value' must be int or float or bool", None),
    ("tile.constant", kernel("%x, %y = tile.constant {value = 1} : i32, i32 // bad"),
     r"expects 1 results, has 2", None),
    ("tile.arange", kernel("%x = tile.arange {start = 0} : tile<4x4xi32> // bad"),
     r"result must be a 1-D i32 tile, got tile<4x4xi32>", None),
    ("tile.arange", kernel("%x = tile.arange {start = 0} : tile<4xf32> // bad"),
     r"result must be a 1-D i32 tile", None),
    ("tile.arange", kernel("%x = tile.arange {start = 0} : i32 // bad"), r"result must be a 1-D i32 tile",
     None),
    ("tile.arange", kernel("%x = tile.arange : tile<4xi32> // bad"), r"missing attribute 'start'", None),
    # ---------------------------------------------------------------- rand
    ("tile.rand", kernel("%x = tile.rand %i, %i4 : tile<4x4xf32> // bad"), r"seed must be an i64 scalar, got i32",
     None),
    ("tile.rand", kernel("%s64 = tile.constant {value = 1} : i64\n%x = tile.rand %s64, %t4 : tile<4x4xf32> // bad"),
     r"offsets must be an i32 or i64 scalar or tile, got tile<4x4xf32>", None),
    ("tile.rand", kernel("%s64 = tile.constant {value = 1} : i64\n%x = tile.rand %s64, %i4 : tile<4xf32> // bad"),
     r"result must be f32 of the offsets' shape", None),
    # ---------------------------------------------------------------- elementwise
    ("tile.add", kernel("%x = tile.add %f, %i : f32 // bad"),
     r"operands and result must have one type, got f32, i32, f32", None),
    ("tile.add", kernel("%x = tile.add %t4, %h4 : tile<4x4xf32> // bad"),
     r"operands and result must have one type", None),
    ("tile.add", kernel("%x = tile.add %f, %f : f16 // bad"), r"must have one type, got f32, f32, f16",
     None),
    ("tile.add", kernel("%x = tile.add %c, %c : i1 // bad"), r"does not take i1 operands", None),
    ("tile.add", kernel("%x = tile.add %f : f32 // bad"), r"takes 2 operands, got 1", None),
    ("tile.add", kernel("%x = tile.add %f, %f, %f : f32 // bad"), r"takes 2 operands, got 3", None),
    ("tile.add", kernel("tile.add %f, %f // bad"), r"expects 1 results, has 0", None),
    ("tile.sub", kernel("%x = tile.sub %t, %t : f32 // bad"), r"expects scalars or tiles, got tensor", None),
    ("tile.mul", kernel("%x = tile.mul %v4, %t4 : tile<4x4xf32> // bad"), r"must have one type", None),
    ("tile.div", kernel("%x = tile.div %i, %i : i32 // bad"), r"does not take i32 operands", None),
    ("tile.floordiv", kernel("%x = tile.floordiv %f, %f : f32 // bad"), r"does not take f32 operands", None),
    ("tile.rem", kernel("%x = tile.rem %t4, %t4 : tile<4x4xf32> // bad"), r"does not take f32 operands",
     None),
    ("tile.cdiv", kernel("%x = tile.cdiv %c, %c : i1 // bad"), r"does not take i1 operands", None),
    ("tile.maximum", kernel("%x = tile.maximum %c4, %c4 : tile<4x4xi1> // bad"),
     r"does not take i1 operands", None),
    ("tile.minimum", kernel("%x = tile.minimum %f, %s : i32 // bad"), r"must have one type", None),
    ("tile.and", kernel("%x = tile.and %f, %f : f32 // bad"), r"does not take f32 operands", None),
    ("tile.or", kernel("%x = tile.or %h4, %h4 : tile<4x4xf16> // bad"), r"does not take f16 operands", None),
    ("tile.xor", kernel("%x = tile.xor %c, %i : i1 // bad"), r"must have one type", None),
    ("tile.neg", kernel("%x = tile.neg %c : i1 // bad"), r"does not take i1 operands", None),
    ("tile.neg", kernel("%x = tile.neg %f, %f : f32 // bad"), r"takes 1 operands, got 2", None),
    ("tile.abs", kernel("%x = tile.abs %f : i32 // bad"), r"must have one type, got f32, i32", None),
    ("tile.not", kernel("%x = tile.not %f : f32 // bad"), r"does not take f32 operands", None),
    ("tile.exp", kernel("%x = tile.exp %i : i32 // bad"), r"does not take i32 operands", None),
    ("tile.exp2", kernel("%x = tile.exp2 %i4 : tile<4x4xi32> // bad"), r"does not take i32 operands", None),
    ("tile.log", kernel("%x = tile.log %f : tile<4xf32> // bad"), r"must have one type", None),
    ("tile.log2", kernel("%x = tile.log2 %c : i1 // bad"), r"does not take i1 operands", None),
    ("tile.sqrt", kernel("%x = tile.sqrt %t : f32 // bad"), r"expects scalars or tiles", None),
    ("tile.rsqrt", kernel("%x = tile.rsqrt : f32 // bad"), r"takes 1 operands, got 0", None),
    ("tile.tanh", kernel("%x = tile.tanh %n : i32 // bad"), r"does not take i32 operands", None),
    ("tile.sigmoid", kernel("%x = tile.sigmoid %i : i32 // bad"), r"does not take i32 operands", None),
    ("tile.erf", kernel("%x = tile.erf %c : i1 // bad"), r"does not take i1 operands", None),
    ("tile.sin", kernel("%x = tile.sin %f : tile<4xf32> // bad"), r"must have one type", None),
    ("tile.cos", kernel("%x = tile.cos %i4 : tile<4x4xi32> // bad"), r"does not take i32 operands", None),
    ("tile.log1p", kernel("%x = tile.log1p %f, %f : f32 // bad"), r"takes 1 operands, got 2", None),
    ("tile.expm1", kernel("%x = tile.expm1 %n : i32 // bad"), r"does not take i32 operands", None),
    ("tile.floor", kernel("%x = tile.floor %i : i32 // bad"), r"does not take i32 operands", None),
    ("tile.ceil", kernel("%x = tile.ceil %c : i1 // bad"), r"does not take i1 operands", None),
    ("tile.fma", kernel("%x = tile.fma %f, %f : f32 // bad"), r"takes 3 operands, got 2", None),
    ("tile.fma", kernel("%x = tile.fma %i, %i, %i : i32 // bad"), r"does not take i32 operands", None),
    ("tile.pow", kernel("%x = tile.pow %i, %i : i32 // bad"), r"does not take i32 operands", None),
    ("tile.shl", kernel("%x = tile.shl %f, %f : f32 // bad"), r"does not take f32 operands", None),
    ("tile.shr", kernel("%x = tile.shr %c, %c : i1 // bad"), r"does not take i1 operands", None),
    ("tile.reduce", kernel('%x = tile.reduce %i4 {kind = "mean", axis = 0} : tile<4xi32> // bad'),
     r"a mean takes a float tile", None),
    ("tile.cmp", kernel('%x = tile.cmp %f, %i {pred = "lt"} : i1 // bad'),
     r"operands must have one scalar or tile type, got f32, i32", None),
    ("tile.cmp", kernel('%x = tile.cmp %f, %f {pred = "lte"} : i1 // bad'),
     r"predicate must be one of lt, le, gt, ge, eq, ne", None),
    ("tile.cmp", kernel('%x = tile.cmp %f, %f {pred = "lt"} : f32 // bad'),
     r"result must be i1 of the operands' shape, got f32", None),
    ("tile.cmp", kernel('%x = tile.cmp %t4, %t4 {pred = "lt"} : i1 // bad'),
     r"result must be i1 of the operands' shape, got i1", None),
    ("tile.cmp", kernel('%x = tile.cmp %t4, %t4 {pred = "lt"} : tile<4xi1> // bad'),
     r"result must be i1 of the operands' shape", None),
    ("tile.cmp", kernel("%x = tile.cmp %f, %f : i1 // bad"), r"missing attribute 'pred'", None),
    ("tile.cmp", kernel("%x = tile.cmp %t, %t {pred = \"eq\"} : i1 // bad"),
     r"operands must have one scalar or tile type", None),
    ("tile.select", kernel("%x = tile.select %f, %f, %f : f32 // bad"),
     r"condition must be i1 of the result's shape, got f32", None),
    ("tile.select", kernel("%x = tile.select %c4, %v4, %v4 : tile<4xf32> // bad"),
     r"condition must be i1 of the result's shape, got tile<4x4xi1>", None),
    ("tile.select", kernel("%x = tile.select %p, %t, %t : tensor<f32[M, 64]> // bad"),
     r"branches and result must have one type", None),
    ("tile.select", kernel("%x = tile.select %c, %f, %i : f32 // bad"),
     r"branches and result must have one type, got f32, i32 -> f32", None),
    ("tile.select", kernel("%x = tile.select %c, %f : f32 // bad"), r"takes 3 operands, got 2", None),
    ("tile.select", kernel("%x = tile.select %tb, %f, %f : f32 // bad"),
     r"condition must be i1 of the result's shape, got tensor<i1\[4\]>", None),
    ("tile.cast", kernel("%x = tile.cast %t4 : tile<4x8xf16> // bad"),
     r"casts keep the shape: tile<4x4xf32> -> tile<4x8xf16>", None),
    ("tile.cast", kernel("%x = tile.cast %f : tile<1xf16> // bad"), r"casts keep the shape", None),
    ("tile.cast", kernel("%x = tile.cast %t : tensor<f16[M, 64]> // bad"), r"casts keep the shape", None),
    # --------------------------------------------------------------------- shapes
    ("tile.splat", kernel("%x = tile.splat %t4 : tile<4x4xf32> // bad"),
     r"splats a scalar to a tile of its dtype", None),
    ("tile.splat", kernel("%x = tile.splat %f : tile<4x4xf16> // bad"),
     r"splats a scalar to a tile of its dtype: f32 -> tile<4x4xf16>", None),
    ("tile.splat", kernel("%x = tile.splat %f : f32 // bad"), r"splats a scalar to a tile", None),
    ("tile.broadcast", kernel("%x = tile.broadcast %t4 : tile<8x8xf32> // bad"),
     r"cannot broadcast tile<4x4xf32> to tile<8x8xf32>", None),
    ("tile.broadcast", kernel("%x = tile.broadcast %v4 : tile<4x4xf32> // bad"), r"cannot broadcast", None),
    ("tile.broadcast", kernel("%x = tile.broadcast %r14 : tile<4x4xf16> // bad"), r"cannot broadcast",
     None),
    ("tile.broadcast", kernel("%x = tile.broadcast %f : tile<4x4xf32> // bad"), r"cannot broadcast f32",
     None),
    ("tile.expand_dims", kernel("%x = tile.expand_dims %t4 {axis = 3} : tile<4x4x1xf32> // bad"),
     r"axis 3 out of range for tile<4x4xf32>", None),
    ("tile.expand_dims", kernel("%x = tile.expand_dims %t4 {axis = 1} : tile<4x4x1xf32> // bad"),
     r"result must be tile<4x1x4xf32>, got tile<4x4x1xf32>", None),
    ("tile.expand_dims", kernel("%x = tile.expand_dims %f {axis = 0} : tile<1xf32> // bad"),
     r"operates on tiles", None),
    ("tile.transpose", kernel("%x = tile.transpose %v4 : tile<4xf32> // bad"),
     r"transposes a 2-D tile: tile<4xf32> -> tile<4xf32>", None),
    ("tile.transpose", kernel("%x = tile.transpose %t48 : tile<4x8xf32> // bad"),
     r"transposes a 2-D tile: tile<4x8xf32> -> tile<4x8xf32>", None),
    ("tile.cluster_reduce", kernel('%x = tile.cluster_reduce %t4 {kind = "sum"} : tile<4x4xf32> // bad'),
     r"needs the pin cluster = 2 or 4", None),
    ("tile.cluster_reduce", kernel('%x = tile.cluster_reduce %b4 {kind = "sum"} : tile<4x4xbf16> // bad',
                                   header="tile.kernel @k {consts = {cluster = 2}}"),
     r"combines an f32 tile across a cluster", None),
    ("tile.cluster_reduce", kernel('%x = tile.cluster_reduce %t4 {kind = "prod"} : tile<4x4xf32> // bad',
                                   header="tile.kernel @k {consts = {cluster = 2}}"),
     r"kind must be one of", None),
    ("tile.reduce", kernel('%x = tile.reduce %t4 {kind = "sum", axis = 2} : tile<4xf32> // bad'),
     r"axis 2 is not an axis of tile<4x4xf32>", None),
    ("tile.reduce", kernel('%x = tile.reduce %t4 {kind = "sum", axis = -1} : tile<4xf32> // bad'),
     r"axis -1 is not an axis of tile<4x4xf32>", None),
    ("tile.reduce", kernel('%x = tile.reduce %t4 {kind = "prod", axis = 0} : tile<4xf32> // bad'),
     r"kind must be one of sum, max, min", None),
    ("tile.reduce", kernel('%x = tile.reduce %t48 {kind = "max", axis = 0} : tile<4xf32> // bad'),
     r"result must be tile<8xf32>, got tile<4xf32>", None),
    ("tile.reduce", kernel('%x = tile.reduce %v4 {kind = "min", axis = 0} : tile<1xf32> // bad'),
     r"result must be f32, got tile<1xf32>", None),
    ("tile.reduce", kernel('%x = tile.reduce %f {kind = "sum", axis = 0} : f32 // bad'),
     r"axis 0 is not an axis of f32", None),
    ("tile.reduce", kernel('%x = tile.reduce %t4 {axis = 0} : tile<4xf32> // bad'),
     r"missing attribute 'kind'", None),
    ("tile.reshape", kernel("%x = tile.reshape %t4 : tile<8xf32> // bad"),
     r"reshapes keep the dtype and the element count: tile<4x4xf32> -> tile<8xf32>", None),
    ("tile.take", kernel("%x = tile.take %t48 {axis = 1, index = 8} : tile<4xf32> // bad"),
     r"index 8 out of range for axis 1 of tile<4x8xf32>", None),
    ("tile.take", kernel("%x = tile.take %v4 {axis = 0, index = 0} : f32 // bad"),
     r"takes the elements at one index of an axis of a tile of rank 2 or more", None),
    ("tile.take", kernel("%x = tile.take %t48 {axis = 1, index = 0} : tile<8xf32> // bad"),
     r"dropping the axis: tile<4x8xf32> -> tile<8xf32>", None),
    ("tile.take", kernel("%x = tile.take %t48 {axis = 2, index = 0} : tile<4xf32> // bad"),
     r"takes the elements at one index of an axis", None),
    ("tile.stack", kernel("%x = tile.stack %t4, %t48 {axis = 2} : tile<4x4x2xf32> // bad"),
     r"stacks two or more tiles of one shape and dtype", None),
    ("tile.stack", kernel("%x = tile.stack %t4, %t4 {axis = 2} : tile<4x4x3xf32> // bad"),
     r"stacks two or more tiles of one shape and dtype along a new axis 2", None),
    ("tile.stack", kernel("%x = tile.stack %t4, %t4 {axis = 0} : tile<4x4x2xf32> // bad"),
     r"stacks two or more tiles", None),
    ("tile.arg_reduce", kernel('%x = tile.arg_reduce %t4 {kind = "argmax", axis = 0} : tile<4xf32> // bad'),
     r"result must be tile<4xi32>, got tile<4xf32>", None),
    ("tile.arg_reduce", kernel('%x = tile.arg_reduce %t4 {kind = "max", axis = 0} : tile<4xi32> // bad'),
     r"kind must be one of argmax, argmin", None),
    ("tile.scan", kernel('%x = tile.scan %t4 {kind = "max", axis = 0} : tile<4x4xf32> // bad'),
     r"kind must be one of sum, prod", None),
    ("tile.scan", kernel('%x = tile.scan %t4 {kind = "sum", axis = 2} : tile<4x4xf32> // bad'),
     r"axis 2 is not an axis of tile<4x4xf32>", None),
    ("tile.scan", kernel('%x = tile.scan %t48 {kind = "sum", axis = 0} : tile<4x4xf32> // bad'),
     r"result must be tile<4x8xf32>, got tile<4x4xf32>", None),
    ("tile.dot_scaled", kernel(_SCALED + "%x = tile.dot_scaled %a, %sa, %a, %sb, %t4 : tile<4x4xf32> // bad"),
     r"shapes do not agree", None),
    ("tile.dot_scaled", kernel(_SCALED + "%x = tile.dot_scaled %a, %sb, %b, %sb, %t4 : tile<4x4xf32> // bad"),
     r"scales must be 4x1 and 1x4", None),
    ("tile.dot_scaled", kernel(_SCALED + "%x = tile.dot_scaled %a, %fa, %b, %sb, %t4 : tile<4x4xf32> // bad"),
     r"scales must be f8e8m0 or f8e4m3 tiles", None),
    ("tile.dot_scaled", kernel(_SCALED + "%x = tile.dot_scaled %ha, %sa, %b, %sb, %t4 : tile<4x4xf32> // bad"),
     r"operands must be one of f8e4m3, f8e5m2", None),
    ("tile.dot_scaled", kernel(_SCALED + "%x = tile.dot_scaled %a, %sa, %b, %sb, %h4 : tile<4x4xf16> // bad"),
     r"the accumulator and result are f32 tiles", None),
    ("tile.unpack_fp4", kernel("%x = tile.unpack_fp4 %t4 {half = 0} : tile<4x4xf32> // bad"),
     r"unpacks an f4e2m1x2 scalar or tile into f32 of its shape", None),
    ("tile.pack_fp4", kernel("%x = tile.pack_fp4 %t4, %t48 : tile<4x4xf4e2m1x2> // bad"),
     r"packs two f32 values of one shape into f4e2m1x2", None),
    ("tile.mma", kernel("%x = tile.mma %t4, %t48, %t4 : tile<4x4xf32> // bad"),
     r"shapes do not agree: tile<4x4xf32> @ tile<4x8xf32> into tile<4x4xf32>", None),
    ("tile.mma", kernel("%x = tile.mma %t48, %t48, %t48 : tile<4x8xf32> // bad"),
     r"shapes do not agree", None),
    ("tile.mma", kernel("%x = tile.mma %h4, %b4, %t4 : tile<4x4xf32> // bad"),
     r"operand dtypes differ: f16 and bf16", None),
    ("tile.mma", kernel("%x = tile.mma %h4, %e4, %t4 : tile<4x4xf32> // bad"),
     r"operand dtypes differ: f16 and f8e4m3", None),
    ("tile.mma", kernel("%x = tile.mma %h4, %h4, %h4 : tile<4x4xf16> // bad"),
     r"the accumulator and result are f32 tiles of one type", None),
    ("tile.mma", kernel("%x = tile.mma %h4, %h4, %t4 : tile<4x4xf16> // bad"),
     r"the accumulator and result are f32 tiles", None),
    ("tile.mma", kernel("%x = tile.mma %i4, %i4, %t4 : tile<4x4xf32> // bad"),
     r"operands must be one of f16, bf16, f8e4m3, f8e5m2, f32", None),
    ("tile.mma", kernel("%x = tile.mma %v4, %t4, %v4 : tile<4xf32> // bad"), r"operands must be 2-D tiles",
     None),
    ("tile.mma", kernel("%x = tile.mma %t4, %t4 : tile<4x4xf32> // bad"), r"takes at least 3 operands, got 2", None),
    # a block-scaled product (decompose's form of dot_scaled on sm_100a)
    ("tile.mma", kernel(_SCALED + "%acc = tile.constant {value = 0.0} : tile<4x4xf32>\n"
                        "%x = tile.mma %a, %b, %acc, %sa : tile<4x4xf32> // bad"), r"takes two scale tiles", None),
    ("tile.mma", kernel(_SCALED + "%acc = tile.constant {value = 0.0} : tile<4x4xf32>\n"
                        "%x = tile.mma %a, %b, %acc, %sb, %sa : tile<4x4xf32> // bad"),
     r"scales must be 4x1 and 1x4", None),
    ("tile.mma", kernel(_SCALED + "%acc = tile.constant {value = 0.0} : tile<4x4xf32>\n"
                        "%x = tile.mma %a, %b, %acc, %fa, %sb : tile<4x4xf32> // bad"),
     r"scales must be f8e8m0 or", None),
    ("tile.mma", kernel(_SCALED + "%acc = tile.constant {value = 0.0} : tile<4x4xf32>\n"
                        "%hb = tile.constant {value = 1.0} : tile<32x4xf16>\n"
                        "%x = tile.mma %ha, %hb, %acc, %sa, %sb : tile<4x4xf32> // bad"),
     r"block-scaled @ takes 8-bit float operands", None),
    # --------------------------------------------------------------------- memory
    ("tile.load", kernel("%x = tile.load %t, %i {box = [4, 4]} : tile<4x4xf32> // bad"),
     r"needs 2 i32 offsets, one per axis of tensor<f32\[M, 64\]>", None),
    ("tile.load", kernel("%x = tile.load %t, %i, %f {box = [4, 4]} : tile<4x4xf32> // bad"),
     r"needs 2 i32 offsets", None),
    ("tile.load", kernel("%x = tile.load %t, %i, %i {box = [4]} : tile<4xf32> // bad"),
     r"box must give a positive extent per axis", None),
    ("tile.load", kernel("%x = tile.load %t, %i, %i {box = [0, 4]} : tile<0x4xf32> // bad"),
     r"box must give a positive extent per axis", None),
    ("tile.load", kernel("%x = tile.load %t, %i, %i {box = [4, 2.0]} : tile<4x2xf32> // bad"),
     r"box must give a positive extent per axis", None),
    ("tile.load", kernel("%x = tile.load %t, %i, %i {box = [4, 4]} : tile<4x8xf32> // bad"),
     r"the box \[4, 4\] of tensor<f32\[M, 64\]> is tile<4x4xf32>, not tile<4x8xf32>", None),
    ("tile.load", kernel("%x = tile.load %t, %i, %i {box = [4, 4]} : tile<4x4xf16> // bad"),
     r"is tile<4x4xf32>, not tile<4x4xf16>", None),
    ("tile.load", kernel("%x = tile.load %t, %i, %i {box = [1, 4], squeeze = [0]} : tile<1x4xf32> // bad"),
     r"is tile<4xf32>, not tile<1x4xf32>", None),
    ("tile.load", kernel("%x = tile.load %t, %i, %i {box = [4, 4], squeeze = [0]} : tile<4xf32> // bad"),
     r"squeezed axes must be axes of the tensor with extent 1", None),
    ("tile.load", kernel("%x = tile.load %t, %i, %i {box = [1, 4], squeeze = [2]} : tile<4xf32> // bad"),
     r"squeezed axes must be axes of the tensor with extent 1", None),
    ("tile.load", kernel('%x = tile.load %t, %i, %i {box = [1, 4], squeeze = ["0"]} : tile<4xf32> // bad'),
     r"squeezed axes must be axes of the tensor with extent 1", None),
    ("tile.load", kernel("%x = tile.load %t, %i, %i {box = [1, 4], squeeze = [0.0]} : tile<4xf32> // bad"),
     r"squeezed axes must be axes of the tensor with extent 1", None),
    ("tile.load", kernel("%x = tile.load %s {box = []} : f32 // bad"), r"expects a tensor, got f32", None),
    ("tile.load", kernel("%x = tile.load %t, %i, %i : tile<4x4xf32> // bad"), r"missing attribute 'box'",
     None),
    ("tile.load", kernel("%x = tile.load %t, %i, %i {box = 4} : tile<4x4xf32> // bad"),
     r"attribute 'box' must be list, got 4", None),
    ("tile.load", kernel("%x = tile.load %t, %i, %i {box = [4, 4], other = \"x\"} : tile<4x4xf32> // bad"),
     r"attribute 'other' must be int or float or bool", None),
    ("tile.load", kernel("%x = tile.load {box = [4, 4]} : tile<4x4xf32> // bad"),
     r"takes at least 1 operands, got 0", None),
    ("tile.masked_store", kernel("tile.masked_store %t, %t4, %t4, %i, %i {box = [4, 4]} // bad"),
     r"the mask is an i1 tile of the value's shape", None),
    ("tile.gather", kernel("%x = tile.gather %t, %t4, %i, %i {box = [4, 4], axis = 0} : tile<4x4xf32> // bad"),
     r"the index is an i32 tile of the result's shape", None),
    ("tile.gather", kernel("%x = tile.gather %t, %i4, %i, %i {box = [4, 4], axis = 2} : tile<4x4xf32> // bad"),
     r"axis 2 must be a kept axis", None),
    ("tile.atomic", kernel('tile.atomic %h, %h4, %i, %i {kind = "max", box = [4, 4]} // bad'),
     r"atomic max takes f32, i32 tensors, not f16", None),
    ("tile.atomic", kernel('tile.atomic %t, %t4, %i, %i {kind = "cas", box = [4, 4]} // bad'),
     r"kind must be one of add, max, min, exch", None),
    ("tile.atomic", kernel('%x = tile.atomic %t, %t4, %i, %i {kind = "add", box = [4, 4]} : tile<4x4xf32> // bad'),
     r"only an atomic on one element returns a value", None),
    ("tile.atomic", kernel('tile.atomic %t, %t4, %i, %i {kind = "add", box = [4, 4], sem = "acquire"} // bad'),
     r"sem = 'acquire' orders what comes after a read", None),
    ("tile.atomic", kernel('tile.atomic %t, %t4, %i, %i {kind = "add", box = [4, 4], sem = "seq"} // bad'),
     r"sem must be one of relaxed, acquire, release, acq_rel", None),
    ("tile.atomic_cas", kernel('%x = tile.atomic_cas %t, %f, %t4, %i, %i {box = [4, 4]} : f32 // bad'),
     r"only an atomic on one element returns a value", None),
    ("tile.atomic_cas", kernel('%x = tile.atomic_cas %t, %i, %f, %i, %i {box = [1, 1], squeeze = [0, 1]} : f32 // bad'),
     r"scalar expected and new values of its dtype", None),
    ("tile.store", kernel("tile.store %t, %h4, %i, %i {box = [4, 4]} // bad"),
     r"the box \[4, 4\] of tensor<f32\[M, 64\]> is tile<4x4xf32>, not tile<4x4xf16>", None),
    ("tile.store", kernel("tile.store %t, %t4, %i {box = [4, 4]} // bad"), r"needs 2 i32 offsets", None),
    ("tile.store", kernel("tile.store %t, %f, %i, %i {box = [1, 1]} // bad"),
     r"is tile<1x1xf32>, not f32", None),
    ("tile.store", kernel("tile.store %t, %f, %i, %i {box = [1, 1], squeeze = [0, 1]}\n"
                          "tile.store %t, %v4, %i, %i {box = [1, 4], squeeze = [1]} // bad"),
     r"squeezed axes must be axes of the tensor with extent 1", None),
    ("tile.store", kernel("%x = tile.store %t, %t4, %i, %i {box = [4, 4]} : i32 // bad"),
     r"expects 0 results, has 1", None),
    ("tile.store", kernel("tile.store %t, %t4, %i, %i {box = [4, 4], other = 0} // bad"),
     r"unknown attribute 'other'", None),
    ("tile.store", kernel("tile.store %t // bad"), r"takes at least 2 operands, got 1", None),
    # ---------------------------------------------------------------- ranks
    ("tile.rank", kernel("%x = tile.rank : f32 // bad"), r"the result is an i32", None),
    ("tile.num_ranks", kernel("%x = tile.num_ranks %i : i32 // bad"), r"takes 0 operands, got 1", None),
    ("tile.peer", kernel("%x = tile.peer %t, %i : tensor<f32[M, 64]> // bad"),
     r"takes a tensor parameter declared '@ ranks', got tensor<f32\[M, 64\]>", None),
    ("tile.peer", kernel("%x = tile.peer %g, %f : tensor<i32[4] @ranks> // bad", RANKS_PARAMS),
     r"the rank is an i32 scalar, got f32", None),
    ("tile.peer", kernel("%x = tile.peer %g, %i : tensor<i32[4]> // bad", RANKS_PARAMS),
     r"the result is the tensor's type tensor<i32\[4\] @ranks>", None),
    ("tile.peer", kernel("%x = tile.peer %g, %i : tensor<i32[4] @ranks>\n"
                         "%y = tile.peer %x, %i : tensor<i32[4] @ranks> // bad", RANKS_PARAMS),
     r"takes a tensor parameter declared '@ ranks'", None),
    ("tile.wait", kernel('tile.wait %t, %i, %i, %i {pred = "ge", box = [1, 1], squeeze = [0, 1]} // bad'),
     r"waits on an i32 flag, got tensor<f32\[M, 64\]>", None),
    ("tile.wait", kernel('tile.wait %g, %f, %i {pred = "ge", box = [1], squeeze = [0]} // bad', RANKS_PARAMS),
     r"compares the flag with an i32 scalar, got f32", None),
    ("tile.wait", kernel('tile.wait %g, %i, %i {pred = "is", box = [1], squeeze = [0]} // bad', RANKS_PARAMS),
     r"pred must be one of lt, le, gt, ge, eq, ne", None),
    ("tile.wait", kernel('tile.wait %g, %i, %i {pred = "ge", box = [4]} // bad', RANKS_PARAMS),
     r"the box \[4\] of tensor<i32\[4\] @ranks> is tile<4xi32>, not i32", None),
    ("tile.wait", kernel('%x = tile.peer %g, %i : tensor<i32[4] @ranks>\n'
                         'tile.wait %x, %i, %i {pred = "ge", box = [1], squeeze = [0]} // bad', RANKS_PARAMS),
     r"waits on a local flag, not on a peer's copy", None),
    ("tile.rank_barrier", kernel("tile.rank_barrier %i // bad"), r"takes 0 operands, got 1", None),
]


def _bad_line(text: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if "// bad" in line)


@pytest.mark.parametrize("kind, text, why, reporter", CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_ill_typed_op_is_rejected(kind: str, text: str, why: str, reporter: str | None) -> None:
    m = parse_module(text, "bad.tkir")  # the text parses: only the verifier can tell it is wrong
    with pytest.raises(TkcVerifyError) as info:
        verify(m)
    err = info.value
    assert re.search(why, err.message), err.message
    assert err.message.startswith(f"'{reporter or kind}'"), err.message
    assert err.loc is not None and (err.loc.file, err.loc.line) == ("bad.tkir", _bad_line(text)), str(err)
    assert f"bad.tkir:{_bad_line(text)}:" in str(err)


def test_every_op_kind_has_an_ill_typed_case() -> None:
    import tkc.ir.dialects  # noqa: F401

    missing = {name for name in OPS if name.startswith("tile.")} - {c[0] for c in CASES}
    assert not missing, f"no verifier case for {sorted(missing)}"


def test_the_prelude_itself_verifies() -> None:
    good = kernel("%x = tile.mma %e4, %e4, %t4 : tile<4x4xf32>\n"
                  "%y = tile.load %t, %i, %i {box = [1, 4], squeeze = [0], other = nan} : tile<4xf32>\n"
                  "tile.store %t, %y, %i, %i {box = [1, 4], squeeze = [0]}\n"
                  "%b = tile.broadcast %r14 : tile<4x4xf32>\n"
                  "%z = tile.reduce %v4 {kind = \"sum\", axis = 0} : f32\n"
                  "%w = tile.select %c, %t4, %b : tile<4x4xf32>\n"
                  "%g = tile.dim %t {axis = 1} : i32\n"
                  "tile.grid %g, %n")
    verify(parse_module(good))


# -------------------------------------------------------- built with Builder
def _kernel(*arg_types) -> tuple[Module, Block, Builder]:
    block = Block(list(arg_types))
    k = T.KernelOp([], [], {"sym_name": "k"}, [Region([block])], Loc("k.py", 1, 1))
    return Module([k]), block, Builder(block, loc=Loc("k.py", 2, 5))


def _rejects(m: Module, why: str, loc: Loc | None = None) -> TkcVerifyError:
    with pytest.raises(TkcVerifyError, match=why) as info:
        verify(m)
    if loc is not None:
        assert info.value.loc == loc
    return info.value


def test_use_before_definition() -> None:
    m, block, b = _kernel()
    one = b.value(T.ConstantOp, [], I32, {"value": 1})
    one.name_hint = "one"
    b.create(T.ReturnOp)
    # An add that uses %one, placed before the constant that defines it.
    block.insert(0, T.AddOp([one, one], [I32], loc=Loc("k.py", 9, 3)))
    err = _rejects(m, r"'tile.add': operand %one is used before it is defined or outside its scope",
                   Loc("k.py", 9, 3))
    assert "k.py:9:3" in str(err)


def test_self_use() -> None:
    m, block, b = _kernel()
    add = b.create(T.AddOp, [], [I32])
    add.operands = [add.result, add.result]
    b.create(T.ReturnOp)
    _rejects(m, r"'tile.add': operand .* is used before it is defined")


def test_value_used_outside_its_region() -> None:
    m, block, b = _kernel()
    zero = b.value(T.ConstantOp, [], I32, {"value": 0})
    body = Block([I32], ["iv"])
    b.create(T.ForOp, [zero, zero, zero], [], regions=[Region([body])])
    with b.at_end(body):
        inner = b.value(T.ConstantOp, [], I32, {"value": 2})
        inner.name_hint = "inner"
        b.create(T.YieldOp)
    b.create(T.AddOp, [inner, body.args[0]], [I32], loc=Loc("k.py", 7, 1))
    b.create(T.ReturnOp)
    _rejects(m, r"operand %inner is used before it is defined or outside its scope", Loc("k.py", 7, 1))


def test_block_argument_used_outside_its_region() -> None:
    m, block, b = _kernel()
    zero = b.value(T.ConstantOp, [], I32, {"value": 0})
    body = Block([I32], ["iv"])
    b.create(T.ForOp, [zero, zero, zero], [], regions=[Region([body])])
    with b.at_end(body):
        b.create(T.YieldOp)
    b.create(T.GridOp, [body.args[0]])
    b.create(T.ReturnOp)
    _rejects(m, r"'tile.grid': operand %iv is used before it is defined or outside its scope")


def test_value_of_another_kernel() -> None:
    m1, _, b1 = _kernel()
    x = b1.value(T.ConstantOp, [], I32, {"value": 0})
    b1.create(T.ReturnOp)
    m2, _, b2 = _kernel()
    b2.create(T.GridOp, [x])
    b2.create(T.ReturnOp)
    m = Module([m1.ops[0], m2.ops[0]])
    _rejects(m, r"'tile.grid': operand .* outside its scope")


def test_sibling_branch_value_is_not_visible() -> None:
    m, block, b = _kernel()
    c = b.value(T.ConstantOp, [], ScalarType(i1), {"value": True})
    then, other = Block(), Block()
    b.create(T.IfOp, [c], [I32], regions=[Region([then]), Region([other])])
    with b.at_end(then):
        v = b.value(T.ConstantOp, [], I32, {"value": 1})
        b.create(T.YieldOp, [v])
    with b.at_end(other):
        b.create(T.YieldOp, [v])
    b.create(T.ReturnOp)
    _rejects(m, r"'tile.yield': operand .* outside its scope")


def test_terminator_in_the_middle_of_a_kernel() -> None:
    m, block, b = _kernel()
    b.create(T.ReturnOp, loc=Loc("k.py", 3, 1))
    b.value(T.ConstantOp, [], I32, {"value": 1})
    b.create(T.ReturnOp)
    _rejects(m, r"'tile.return': terminator is not the last op of its block", Loc("k.py", 3, 1))


def test_kernel_without_return() -> None:
    m, block, b = _kernel()
    b.value(T.ConstantOp, [], I32, {"value": 1})
    _rejects(m, r"'tile.kernel': .*terminator", Loc("k.py", 1, 1))


def test_kernel_with_empty_body() -> None:
    m, _, _ = _kernel()
    _rejects(m, r"'tile.kernel': .*terminator")


def test_two_grids() -> None:
    m, block, b = _kernel()
    one = b.value(T.ConstantOp, [], I32, {"value": 1})
    b.create(T.GridOp, [one])
    b.create(T.GridOp, [one, one], loc=Loc("k.py", 5, 5))
    b.create(T.ReturnOp)
    _rejects(m, r"'tile.grid': a kernel has at most one launch grid", Loc("k.py", 5, 5))


def test_unregistered_op_kind() -> None:
    class Bogus(Operation):
        name = "tile.bogus"

    class FakeAdd(T.AddOp):  # right name, wrong class
        pass

    for cls in (Bogus, FakeAdd):
        m, block, b = _kernel()
        b.create(cls, [], [])
        b.create(T.ReturnOp)
        _rejects(m, r"op kind is not registered")


def test_region_with_two_blocks() -> None:
    m, block, b = _kernel()
    zero = b.value(T.ConstantOp, [], I32, {"value": 0})
    region = Region([Block([I32]), Block([I32])])
    for blk in region.blocks:
        blk.append(T.YieldOp([], []))
    b.create(T.ForOp, [zero, zero, zero], [], regions=[region])
    b.create(T.ReturnOp)
    _rejects(m, r"'tile.for': regions in tkc hold exactly one block")


def test_broken_parent_link() -> None:
    m, block, b = _kernel()
    op = b.value(T.ConstantOp, [], I32, {"value": 0}).owner
    op.parent = None
    b.create(T.ReturnOp)
    _rejects(m, r"'tile.constant': op's parent link is broken")


def test_attribute_types_set_from_python() -> None:
    for attrs, why in [
        ({}, r"missing attribute 'value'"),
        ({"value": "1"}, r"attribute 'value' must be int or float or bool"),
        ({"value": None}, r"attribute 'value' must be int or float or bool, got None"),
        ({"value": 1, "other": 2}, r"unknown attribute 'other'"),
    ]:
        m, _, b = _kernel()
        b.create(T.ConstantOp, [], [F32], attrs)
        b.create(T.ReturnOp)
        _rejects(m, why)


def test_mma_built_with_builder() -> None:
    for a, bt, acc, why in [
        ((16, 8), (16, 8), (16, 8), r"shapes do not agree"),
        ((16, 8, f16), (8, 16, bf16), (16, 16), r"operand dtypes differ: f16 and bf16"),
        ((16, 8, f16), (8, 16, f16), (16, 16, bf16),
         r"the accumulator and result are f32 tiles"),
    ]:
        m, _, b = _kernel()
        ta, tb, tc = (TileType(s[:2], s[2] if len(s) > 2 else f32) for s in (a, bt, acc))
        vals = [b.value(T.ConstantOp, [], t, {"value": 0.0}) for t in (ta, tb, tc)]
        b.create(T.MmaOp, vals, [tc])
        b.create(T.ReturnOp)
        _rejects(m, r"'tile.mma': " + why)


def test_yield_type_mismatch_built_with_builder() -> None:
    m, block, b = _kernel()
    zero = b.value(T.ConstantOp, [], I32, {"value": 0})
    f = b.value(T.ConstantOp, [], F32, {"value": 0.5})
    body = Block([I32, F32])
    b.create(T.ForOp, [zero, zero, zero, f], [F32], regions=[Region([body])])
    with b.at_end(body):
        b.create(T.YieldOp, [body.args[0]], loc=Loc("k.py", 4, 7))
    b.create(T.ReturnOp)
    _rejects(m, r"'tile.yield': yields \(i32\) but 'tile.for' results are \(f32\)", Loc("k.py", 4, 7))


# ---------------------------------------------------- module-level rules
def test_top_level_holds_kernels_only() -> None:
    m = Module([T.ConstantOp([], [I32], {"value": 1})])
    _rejects(m, r"kernel")


def test_load_other_matches_the_dtype() -> None:
    text = kernel("%x = tile.load %tb, %i {box = [4], other = 1.5} : tile<4xi1> // bad")
    with pytest.raises(TkcVerifyError, match="other"):
        verify(parse_module(text))


def test_box_extents_are_ints_not_bools() -> None:
    # ``true`` is a Python int; a box extent written as a bool is a mistake, not an extent of 1.
    text = kernel("%x = tile.load %t, %i, %i {box = [true, 4]} : tile<1x4xf32> // bad")
    with pytest.raises(TkcVerifyError, match="box must give a positive extent"):
        verify(parse_module(text))

