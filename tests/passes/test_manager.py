"""The pass manager: dumps (stream and numbered files), timing, reproducers
for failing passes, and errors for unknown pass names."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from tkc.cli import cli
from tkc.errors import Loc, TkcPassError, TkcTypeError, TkcUsageError, TkcVerifyError
from tkc.ir.core import Module
from tkc.ir.parser import parse_module
from tkc.ir.printer import print_module
from tkc.ir.verifier import verify
from tkc.options import Knobs
from tkc.passes.manager import PassManager, PassOptions
from tkc.passes.pipeline import DEFAULT_PIPELINE, PASSES
from tkc.target import TARGETS, Target

GEMM = Path(__file__).parent / "pipeline" / "gemm_frontend.tkir"
HEADER = re.compile(r"^// -----// IR Dump (Before|After) (\S+) \((\d+)\) //----- //$", re.M)


def gemm() -> Module:
    return parse_module(GEMM.read_text(), str(GEMM))


def _sections(text: str) -> list[tuple[str, str, str]]:
    """(when, pass, IR) for each dump in a stream."""
    heads = list(HEADER.finditer(text))
    ends = [h.start() for h in heads[1:]] + [len(text)]
    return [(h.group(1), h.group(2), text[h.end():end]) for h, end in zip(heads, ends)]


# ------------------------------------------------------------------ running
def test_runs_the_pipeline_and_verifies() -> None:
    m = gemm()
    PassManager(DEFAULT_PIPELINE).run(m)
    verify(m)
    assert "tile.add" not in print_module(m)


def test_pipeline_text_is_trimmed_and_may_be_empty() -> None:
    assert PassManager(" canonicalize , cse,,dce ").names == ["canonicalize", "cse", "dce"]
    m = gemm()
    before = print_module(m)
    PassManager("").run(m)
    assert print_module(m) == before


def test_unknown_pass_lists_the_known_ones() -> None:
    with pytest.raises(TkcUsageError,
                       match=r"unknown pass 'cse2'; known passes: .*canonicalize, count-divisions, cse, dce"):
        PassManager("canonicalize,cse2")


def test_unknown_pass_to_dump_is_an_error() -> None:
    with pytest.raises(TkcUsageError, match="unknown pass to dump 'csee'"):
        PassManager("cse", PassOptions(dump_after=("csee",)))


def test_invalid_input_is_not_blamed_on_a_pass() -> None:
    m = gemm()
    m.kernel().regions[0].block.ops.pop()  # drop tile.return
    with pytest.raises(TkcVerifyError):
        PassManager("cse").run(m)


# -------------------------------------------------------------------- dumps
def test_dump_after_all_to_a_stream_reparses() -> None:
    out = io.StringIO()
    PassManager(DEFAULT_PIPELINE, PassOptions(dump_after=("all",), stream=out)).run(gemm())
    sections = _sections(out.getvalue())
    assert [(w, p) for w, p, _ in sections] == [
        ("After", "canonicalize"), ("After", "licm"), ("After", "cse"), ("After", "dce")]
    assert "// -----// IR Dump After cse (3) //----- //" in out.getvalue()
    for _, _, ir in sections:
        verify(parse_module(ir))
    verify(parse_module(out.getvalue()))  # headers are comments: the whole stream parses too


def test_dump_before_one_pass() -> None:
    out = io.StringIO()
    PassManager(DEFAULT_PIPELINE, PassOptions(dump_before=("dce",), stream=out, locs=False)).run(gemm())
    [(when, name, ir)] = _sections(out.getvalue())
    assert (when, name) == ("Before", "dce")
    assert "loc(" not in ir
    assert "%19 = tile.mul" in ir  # an unused slice end that dce is about to drop


def test_dump_dir_numbers_files_in_order(tmp_path: Path) -> None:
    PassManager(DEFAULT_PIPELINE, PassOptions(dump_dir=tmp_path)).run(gemm())
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == [
        "00-input.tkir", "01-canonicalize.tkir", "02-licm.tkir", "03-cse.tkir", "04-dce.tkir"]
    for p in tmp_path.iterdir():
        verify(parse_module(p.read_text(), str(p)))
    assert "tile.add %acc_2" in (tmp_path / "00-input.tkir").read_text()
    assert "tile.add %acc_2" not in (tmp_path / "01-canonicalize.tkir").read_text()


def test_dump_dir_before_and_after(tmp_path: Path) -> None:
    opts = PassOptions(dump_dir=tmp_path, dump_before=("cse",), dump_after=("cse", "dce"))
    PassManager(DEFAULT_PIPELINE, opts).run(gemm())
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["00-input.tkir", "01-before-cse.tkir", "02-cse.tkir", "03-dce.tkir"]


def test_env_dump_knobs_add_to_the_options(tmp_path: Path) -> None:
    opts = PassOptions(dump_after=("cse",)).with_knobs(Knobs(dump_ir=("dce", "cse"), dump_dir=tmp_path))
    assert opts.dump_after == ("cse", "dce")
    assert opts.dump_dir == tmp_path


# ------------------------------------------------------------------- timing
def test_timing_table() -> None:
    out = io.StringIO()
    PassManager(DEFAULT_PIPELINE, PassOptions(timing=True, stream=out)).run(gemm())
    text = out.getvalue()
    for name in ("canonicalize", "cse", "dce", "(verify)", "total"):
        assert re.search(rf"^\s+\d+\.\d{{3}}\s+\d+\.\d%\s+{re.escape(name)}$", text, re.M), text


# ---------------------------------------------------------- failing passes
def _explode(module: Module, *_: object) -> None:
    raise ValueError("boom")


def _located_error(module: Module, *_: object) -> None:
    raise TkcTypeError("cannot handle this op", Loc("k.tk", 3, 9))


def _break_ssa(module: Module, *_: object) -> None:
    body = module.kernel().regions[0].block
    body.ops.remove(next(op for op in body.ops if op.name == "tile.dim"))


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_crashing_pass_leaves_a_reproducer(in_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(PASSES, "explode", _explode)
    m = gemm()
    with pytest.raises(TkcPassError) as info:
        PassManager("canonicalize,explode,dce").run(m)
    err = info.value
    assert err.pass_name == "explode"
    msg = str(err)
    assert "pass 'explode' failed: ValueError: boom" in msg
    assert isinstance(err.__cause__, ValueError)
    path = err.reproducer
    assert path is not None and path.parent == Path("tkc-reproducers") and path.name.endswith("-explode.tkir")
    assert f"reproducer: {path}" in msg and f"rerun with: tkc opt {path} -p explode" in msg
    text = path.read_text()
    assert text.splitlines()[0] == f"// reproduce: tkc opt {path} -p explode"
    assert "// pipeline: canonicalize,explode,dce (pass 2, 'explode', failed; target sm_90a)" in text
    # The reproducer holds the input of the failing pass: canonicalize already ran.
    reproduced = parse_module(text, str(path))
    verify(reproduced)
    assert "tile.add %acc_2" not in text

    # `tkc opt` reruns it: the same failure, and a clean run with other passes.
    runner = CliRunner()
    again = runner.invoke(cli, ["opt", str(path), "-p", "explode"])
    assert again.exit_code == 1
    assert "pass 'explode' failed: ValueError: boom" in again.stderr
    ok = runner.invoke(cli, ["opt", str(path), "-p", "dce"])
    assert ok.exit_code == 0, ok.stderr


def test_a_failure_on_another_target_reproduces_with_it(in_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The passes lower differently for each target: the command a reproducer prints names it
    def only_on_sm_100a(module: Module, options: object, target: Target) -> None:
        if target.name == "sm_100a":
            raise ValueError("boom on sm_100a")

    monkeypatch.setitem(PASSES, "picky-target", only_on_sm_100a)
    with pytest.raises(TkcPassError) as info:
        PassManager("picky-target").run(gemm(), target=TARGETS["sm_100a"])
    path = info.value.reproducer
    assert f"rerun with: tkc opt {path} -p picky-target --target sm_100a" in str(info.value)
    assert path.read_text().splitlines()[0] == f"// reproduce: tkc opt {path} -p picky-target --target sm_100a"
    runner = CliRunner()
    again = runner.invoke(cli, ["opt", str(path), "-p", "picky-target", "--target", "sm_100a"])
    assert again.exit_code == 1 and "boom on sm_100a" in again.stderr
    assert runner.invoke(cli, ["opt", str(path), "-p", "picky-target"]).exit_code == 0


def test_located_error_in_a_pass(in_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(PASSES, "picky", _located_error)
    with pytest.raises(TkcPassError, match=r"pass 'picky' failed: k\.tk:3:9: cannot handle this op"):
        PassManager("picky").run(gemm())


def test_pass_leaving_invalid_ir(in_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(PASSES, "break-ssa", _break_ssa)
    with pytest.raises(TkcPassError, match=r"pass 'break-ssa' failed: it left invalid IR: .*used before") as info:
        PassManager("cse,break-ssa").run(gemm())
    # The reproducer is the valid input of the pass, so it reproduces the failure.
    verify(parse_module(info.value.reproducer.read_text()))


def test_no_reproducer_when_disabled(in_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(PASSES, "explode", _explode)
    with pytest.raises(TkcPassError) as info:
        PassManager("explode", PassOptions(reproducer_dir=None)).run(gemm())
    assert info.value.reproducer is None
    assert "reproducer" not in str(info.value)
    assert not (in_tmp / "tkc-reproducers").exists()


# ------------------------------------------------------------ options and target
def test_every_pass_gets_the_kernels_options_and_the_target(monkeypatch: pytest.MonkeyPatch) -> None:
    from tkc.pins import Options
    from tkc.target import DEFAULT_TARGET, TARGETS

    seen = []
    monkeypatch.setitem(PASSES, "record", lambda module, options, target: seen.append((options, target)))
    m = gemm()
    m.kernel().attributes["consts"] = {**m.kernel().attributes.get("consts", {}), "stages": 2}
    PassManager("record,cse,record").run(m)
    assert seen == [(Options(stages=2), DEFAULT_TARGET)] * 2
    seen.clear()
    PassManager("record").run(gemm(), Options(pingpong=True), TARGETS["sm_100a"])
    assert seen == [(Options(pingpong=True), TARGETS["sm_100a"])]


def test_a_bad_pin_is_refused_before_the_first_pass() -> None:
    m = gemm()
    m.kernel().attributes["consts"] = {"cluster": 3}
    with pytest.raises(TkcUsageError, match="pin cluster = 3: a cluster has 1, 2 or 4 programs") as e:
        PassManager("cse").run(m)
    assert e.value.loc is not None


def test_kernels_pinned_differently_get_their_own_options(monkeypatch: pytest.MonkeyPatch) -> None:
    from tkc.pins import Options

    text = GEMM.read_text()
    m = parse_module(text + text.replace("@gemm", "@gemm2") + text.replace("@gemm", "@gemm3"), "three.tkir")
    m.kernel("gemm2").attributes["consts"] = {"stages": 3}
    seen = []
    monkeypatch.setitem(PASSES, "record", lambda module, options, target: seen.append(
        ([k.attributes["sym_name"] for k in module.ops], options)))
    PassManager("record,cse").run(m)
    assert sorted(seen) == sorted([(["gemm", "gemm3"], Options()), (["gemm2"], Options(stages=3))])
    assert [k.attributes["sym_name"] for k in m.ops] == ["gemm", "gemm2", "gemm3"]  # back in their places
    assert all(k.parent is m.body for k in m.ops)


# ------------------------------------------------------- verifying, and finding the pass
def _count_verifies(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    import tkc.passes.manager as manager

    calls: list[int] = []
    real = manager.verify
    monkeypatch.setattr(manager, "verify", lambda m: (calls.append(1), real(m))[1])
    return calls


def test_a_clean_run_verifies_its_input_and_its_result_only(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _count_verifies(monkeypatch)
    PassManager(DEFAULT_PIPELINE).run(gemm())
    assert len(calls) == 2
    calls.clear()
    PassManager(DEFAULT_PIPELINE, PassOptions(verify_each=True)).run(gemm())
    assert len(calls) == 1 + len(DEFAULT_PIPELINE.split(","))


def test_invalid_ir_mid_pipeline_is_put_on_the_pass_that_left_it(in_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Nothing is verified between passes on a clean run: the run again from the input finds it
    monkeypatch.setitem(PASSES, "break-ssa", _break_ssa)
    with pytest.raises(TkcPassError, match=r"pass 'break-ssa' failed: it left invalid IR: .*used before") as info:
        PassManager("canonicalize,break-ssa,cse,dce").run(gemm())
    assert info.value.pass_name == "break-ssa"
    text = info.value.reproducer.read_text()
    assert "(pass 2, 'break-ssa', failed; target sm_90a)" in text
    verify(parse_module(text))  # break-ssa's input, which canonicalize made
    assert "tile.add %acc_2" not in text


def test_a_crash_after_invalid_ir_is_put_on_the_earlier_pass(in_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # explode would have run on IR that does not verify: break-ssa is the failure, as it
    # is when every pass is verified as it runs
    monkeypatch.setitem(PASSES, "break-ssa", _break_ssa)
    monkeypatch.setitem(PASSES, "explode", _explode)
    for each in (False, True):
        with pytest.raises(TkcPassError, match=r"pass 'break-ssa' failed: it left invalid IR") as info:
            PassManager("cse,break-ssa,dce,explode", PassOptions(verify_each=each)).run(gemm())
        assert info.value.pass_name == "break-ssa"


def test_a_pass_that_fails_only_once_gets_no_reproducer(in_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The run again is how the failing pass's input is rebuilt: a pass that does not fail the
    # same way twice is still named, with why no reproducer could be written
    seen: list[int] = []

    def first_time_only(module: Module, *_: object) -> None:
        seen.append(1)
        if seen.count(1) == 1:
            raise ValueError("boom once")

    def second_time_only(module: Module, *_: object) -> None:
        seen.append(2)
        if seen.count(2) == 2:
            raise RuntimeError("different now")

    monkeypatch.setitem(PASSES, "flaky", second_time_only)
    monkeypatch.setitem(PASSES, "once", first_time_only)
    with pytest.raises(TkcPassError) as info:
        PassManager("flaky,once").run(gemm())
    msg = str(info.value)
    assert "pass 'once' failed: ValueError: boom once" in msg
    assert "could not rebuild the failing pass's input: RuntimeError: different now" in msg
    assert info.value.reproducer is None
