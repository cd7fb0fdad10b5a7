"""The benchmark harness's own logic that runs without a GPU: contenders timed in turns."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import harness  # noqa: E402


def fake_gpu(monkeypatch: pytest.MonkeyPatch, seconds: dict[str, list[float]]) -> list[tuple[str, int]]:
    """``gpu_time`` replaced: each contender (a function returning its name) answers its next
    time from ``seconds``; the calls are recorded as (name, runs)."""
    calls: list[tuple[str, int]] = []

    def gpu_time(fn, runs=50, warmup=5, flush=True):
        name = fn()
        calls.append((name, runs))
        return SimpleNamespace(median_s=seconds[name].pop(0))
    monkeypatch.setattr(harness, "gpu_time", gpu_time)
    return calls


def test_contenders_take_turns_and_keep_their_median_round(monkeypatch: pytest.MonkeyPatch) -> None:
    # tkc's second round ran while the clock dropped (2.5 ms); the median drops it.
    calls = fake_gpu(monkeypatch, {"tkc": [1.0e-3, 2.5e-3, 1.1e-3], "peer": [1.2e-3, 1.3e-3, 1.25e-3]})
    got = harness.in_turns({"tkc": lambda: "tkc", "peer": lambda: "peer"}, runs=50)
    assert got == {"tkc": 1.1e-3, "peer": 1.25e-3}
    # Three rounds of 16 runs; round r starts with contender r.
    assert calls == [("tkc", 16), ("peer", 16), ("peer", 16), ("tkc", 16), ("tkc", 16), ("peer", 16)]


def test_a_round_takes_at_least_ten_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = fake_gpu(monkeypatch, {"copy": [1.0, 2.0, 3.0, 4.0, 5.0]})
    assert harness.in_turns({"copy": lambda: "copy"}, runs=20, rounds=5) == {"copy": 3.0}
    assert [r for _, r in calls] == [10] * 5


def test_every_contender_warms_up_for_the_same_time_with_the_flush(monkeypatch: pytest.MonkeyPatch) -> None:
    """harness.gpu_time: the 256 MB flush, and a warm-up of WARMUP_S seconds whatever the call
    takes (five calls are 16 ms of long attention, a fraction of a millisecond of a softmax)."""
    seen = []
    monkeypatch.setattr(harness.timing, "gpu_time", lambda *a, **k: seen.append((a, k)))
    harness.gpu_time(print, 16)
    harness.gpu_time(print, 10, flush=False)
    assert seen == [((print, 16, 5, 256 * 2**20), {"warmup_s": harness.WARMUP_S}),
                    ((print, 10, 5, 0), {"warmup_s": harness.WARMUP_S})]
    assert harness.WARMUP_S >= 0.025  # at least triton.testing.do_bench's warm-up


def test_in_alternation_takes_calls_in_turn_after_a_timed_warmup(monkeypatch: pytest.MonkeyPatch) -> None:
    """Contenders alternate call by call, cycle c starting at contender c, each call after a
    flush; WARMUP_S of cycles first; each contender's median call, its flush left out."""
    from fake_gpu import FakeStream

    s = FakeStream()
    monkeypatch.setitem(sys.modules, "torch", s.torch())  # what tkc.runtime.timing imports
    fast, slow = s.kernel(lambda now: 1e-3, name="fast"), s.kernel(lambda now: 3e-3, name="slow")
    got = harness.in_alternation({"fast": fast, "slow": slow}, runs=4)
    assert got == {"fast": pytest.approx(1e-3), "slow": pytest.approx(3e-3)}
    calls = [x for x in s.log if x in ("fast", "slow")]
    # 0.1 s of 4.17 ms cycles: the first, timed, then 24 more; then four timed cycles.
    assert len(calls) == 2 * (1 + 24 + 4)
    assert calls[-8:] == ["fast", "slow", "slow", "fast", "fast", "slow", "slow", "fast"]
    assert s.log[-4:] == ["flush", "record", "fast", "record"]


def test_the_layernorm_breakdown_variants_compile(tmp_path: Path) -> None:
    """benchmarks/norm_breakdown.py takes the bias, then the weight, out of layernorm_split.tk's
    output expression: each variant still compiles, and computes less."""
    pytest.importorskip("torch")
    import norm_breakdown

    from tkc.frontend import compile_source

    paths = norm_breakdown.variants(tmp_path)
    assert list(paths) == ["layernorm_split.tk", "without bias", "without weight and bias"]
    texts = [p.read_text() for p in paths.values()]
    assert [t.count("wt[None, :]") for t in texts] == [1, 1, 0]
    assert [t.count("bt[None, :]") for t in texts] == [1, 0, 0]
    for path in paths.values():
        compile_source(path.read_text(), str(path), {"BN": 4096, "cluster": 4})  # parses and type-checks


def test_the_gemm_epilogue_bound_cuts_only_the_epilogue() -> None:
    """benchmarks/gemm_epilogue_bound.py's cut copies of gemm.tk: without partial read waits,
    then with one stmatrix and one TMA store left; every wgmma and every ring wait stays."""
    cut = _epilogue_cuts()
    assert list(cut) == ["as compiled", "no read waits", "one slice"]
    texts = {name: c.asm["ptx"] for name, c in cut.items()}
    full, no_wait, one = texts.values()

    def count(pattern: str, text: str) -> int:
        return sum(1 for line in text.split("\n") if line.strip().startswith(pattern))

    assert count("cp.async.bulk.wait_group.read", full) > count("cp.async.bulk.wait_group.read", no_wait)
    assert count("stmatrix", full) == count("stmatrix", no_wait) > 1
    assert count("stmatrix", one) == 1
    assert count("cp.async.bulk.tensor.2d.global.shared::cta", one) == 1
    for pattern in ("wgmma.mma_async", "mbarrier.try_wait", "cp.async.bulk.tensor.2d.shared::cluster"):
        assert count(pattern, one) == count(pattern, full) > 0
    assert all("cubin" not in c.asm for name, c in cut.items() if name != "as compiled")


def test_the_gemm_epilogue_bound_cuts_still_assemble() -> None:
    from tkc.codegen.ptxas import assemble, find_ptxas, searched

    if find_ptxas() is None:
        pytest.skip(f"no ptxas found (searched {', '.join(searched())})")
    for name, c in _epilogue_cuts().items():
        assert assemble(c.asm["ptx"], "sm_90a").kernels["gemm"].registers > 0, name


def _epilogue_cuts() -> dict:
    import gemm_epilogue_bound as bound

    from tkc.compiler import compile_kernel

    return bound.variants(compile_kernel(Path(__file__).resolve().parents[1] / "examples" / "gemm.tk", {},
                                         stop="ptx"))


def test_the_attention_backward_benchmark_counts_and_parses_as_documented() -> None:
    """FlashAttention-3's count (a backward is 2.5 forwards of 4 B H N^2 D, half causal), the
    --variants syntax, and the shapes of the issue (16k tokens, H x D = 2048; B=16, H=16)."""
    pytest.importorskip("torch")
    import attn_train

    assert attn_train.flops(2, 16, 1024, 128, False) == 2.5 * 4 * 2 * 16 * 1024 * 1024 * 128
    assert attn_train.flops(2, 16, 1024, 128, True) == attn_train.flops(2, 16, 1024, 128, False) / 2
    assert attn_train.parse_variants("BM=32; warp_specialize=true,BM=64") == [
        {"BM": 32}, {"warp_specialize": True, "BM": 64}]
    shapes = attn_train.shapes_of(False, {"long", "short"})
    assert all(B * N == 16384 and H * D == 2048 for g, B, H, KVH, N, D in shapes if g == "long")
    assert {N for g, B, H, KVH, N, D in shapes if g == "short"} == {768, 1024, 1536, 2048, 3072}


def test_the_recorded_command_names_only_a_subset_of_groups() -> None:
    groups = ["gemm_epilogue", "rope", "norm"]
    assert harness.run_command("tk_kernels.py", False, "gemm_epilogue,rope,norm", groups) == \
        "python benchmarks/tk_kernels.py"
    assert harness.run_command("tk_kernels.py", True, "rope", groups) == \
        "python benchmarks/tk_kernels.py --quick --only rope"


def test_tk_kernels_without_a_gpu_says_so_and_refuses_unknown_groups() -> None:
    script = str(Path(__file__).resolve().parents[1] / "benchmarks" / "tk_kernels.py")
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    r = subprocess.run([sys.executable, script, "--quick", "--no-record"], capture_output=True, text=True, env=env)
    assert r.returncode == 1 and "needs a CUDA GPU" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run([sys.executable, script, "--only", "rope,fft"], capture_output=True, text=True, env=env)
    assert r.returncode == 1 and "unknown group(s) fft" in r.stderr


def test_ncu_hot_spots_reads_the_source_page() -> None:
    """``benchmarks/ncu_profile.py --source``'s summary: the instructions with the most stall
    samples, in program order with their neighbours, from Nsight Compute's source-page CSV
    (a "Kernel Name" line before the header)."""
    import ncu_profile

    head = '"Address","Source","Warp Stall Sampling (All Samples)","stall_wait"'
    rows = [f'"0x{i:x}","INSN{i}","{s}","0"' for i, s in enumerate([1, 0, 50, 0, 0, 0, 30, 2])]
    text = ncu_profile.hot_spots("\n".join(['"Kernel Name","k",', head, *rows]), top=2, around=1)
    lines = text.splitlines()
    assert lines[0].startswith("83 samples")
    assert [ln.split()[-1] for ln in lines[1:] if ln != "..."] == ["INSN1", "INSN2", "INSN3", "INSN5", "INSN6", "INSN7"]
    assert any(ln.startswith("*") and ln.endswith("INSN2") and "60.2%" in ln for ln in lines)
    assert "no source page" in ncu_profile.hot_spots("")


def test_compare_revisions_reads_table_rows_and_merges_them() -> None:
    """``benchmarks/compare_revisions.py``: each markdown row's number (the first after the
    problem, or a named column's), and the merged table's ratio of the means."""
    import compare_revisions as cr

    text = ("noise\n| problem | tkc | peer |\n|---|---|---|\n| a | 10 | 7 |\n| b, causal | x | 8.5 |\n"
            "\n| problem | tkc |\n|---|---|\n| a | 99 |\n")
    assert cr.rows(text) == {"a": 10.0, "b, causal": 8.5}
    assert cr.rows(text, column="peer") == {"a": 7.0, "b, causal": 8.5}
    merged = cr.merge([{"a": 10.0}, {"a": 12.0}], [{"a": 13.2}, {"a": 13.2, "c": 1.0}])
    assert "| a | 10.0 | 12.0 | 13.2 | 13.2 | 1.200x |" in merged
    assert "| c | - | - | - | 1.0 | - |" in merged


def test_compare_revisions_runs_each_side_with_its_own_install(tmp_path) -> None:
    """Both installs run the command, base first, each importing its own tkc (a command that
    prints which one it imported)."""
    import compare_revisions as cr

    bench = tmp_path / "bench.py"
    bench.write_text("import tkc\nv = 1 if 'site-base' in tkc.__file__ else 2\n"
                     "print(f'| problem | tkc |\\n|---|---|\\n| row | {v} |')\n")
    out = tmp_path / "out"
    cr.main(["--base", "HEAD", "--rounds", "1", "--out", str(out), "--", sys.executable, str(bench)])
    assert "| row | 1 |" in (out / "01-base.txt").read_text()
    assert "| row | 2 |" in (out / "02-tree.txt").read_text()
    # The base from a folder (a machine with the working tree but not its history).
    base = tmp_path / "base"
    base.mkdir()
    archive = subprocess.run(["git", "-C", str(cr.ROOT), "archive", "HEAD", *cr.PACKAGE], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(base)], input=archive, check=True)
    cr.main(["--base-tree", str(base), "--rounds", "1", "--out", str(out), "--", sys.executable, str(bench)])
    assert "| row | 1 |" in (out / "01-base.txt").read_text()


def test_a_timeline_counts_each_kind_on_the_last_rank_and_its_idle_gaps(tmp_path: Path) -> None:
    from timeline import Span, draw, summary

    gemm, nccl = "nvjet_tst_128x256_h_bz_coopA", "ncclDevKernel_AllGather"
    spans = {"NCCL+cuBLAS": [Span(0, gemm, 0, 100), Span(0, nccl, 100, 150),
                             Span(1, gemm, 5, 90), Span(1, nccl, 95, 180)],
             "tkc": [Span(0, "reducescatter", 0, 120), Span(1, "reducescatter", 2, 121)]}
    text = summary(spans)
    assert ("- NCCL+cuBLAS: 175 µs with every rank in (180 from the first kernel); rank 1 (last to finish): "
            "cuBLAS 85, NCCL 85, idle before and between its kernels 10") in text, text
    assert "first kernel starts (µs, rank by rank): 0, 5" in text, text
    assert ("- tkc: 119 µs with every rank in (121 from the first kernel); rank 1 (last to finish): tkc 119, "
            "idle before and between its kernels 2;") in text, text
    path = tmp_path / "t.png"
    if draw([("a row", spans)], path):  # False only without matplotlib
        assert path.stat().st_size > 1000


def test_sass_loops_finds_each_loop_and_counts_its_opcodes() -> None:
    """A loop is the lines from a label to a later branch back to it (predicated too); a branch
    forward is not one; an inner loop's instructions count in the outer one as well."""
    import sass_loops

    sass = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_1:
        /*0010*/                   UIMAD UR4, UR5, 0x3, URZ ;
.L_x_2:
        /*0020*/                   FADD R2, R2, R3 ;
        /*0030*/              @!P0 FFMA R2, R4, R5, R2 ;
        /*0040*/               @P1 BRA `(.L_x_2) ;
        /*0050*/                   ISETP.GE.AND P0, PT, R6, 0x10, PT ;
        /*0060*/               @P0 BRA `(.L_x_3) ;
        /*0070*/                   BRA `(.L_x_1) ;
.L_x_3:
        /*0080*/                   EXIT ;
"""
    found = sass_loops.loops(sass)
    assert [dict(ops) for _, _, ops in found] == [
        {"FADD": 1, "FFMA": 1, "BRA": 1},
        {"UIMAD": 1, "FADD": 1, "FFMA": 1, "BRA": 3, "ISETP": 1}]
    assert sass_loops.describe(found[1][2]).startswith("7 instructions, 1 uniform: BRA 3")


def test_a_cold_compile_finds_no_tree_or_ptxas_result_of_an_earlier_one(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """benchmarks/run.py's cold compiles: what tkc keeps in the process (parsed trees, ptxas's
    results) and the cache folder are empty for each compile, and the folder is given back."""
    pytest.importorskip("torch")
    import run

    from tkc.codegen import ptxas
    from tkc.frontend import parser

    monkeypatch.setenv("TKC_CACHE_DIR", str(tmp_path))
    parser._TREES[("x", "f.tk", 1)] = None
    ptxas._ASSEMBLED[("ptxas", "sm_90a", True, "text")] = None
    with run.cold():
        assert not parser._TREES and not ptxas._ASSEMBLED
        inside = Path(os.environ["TKC_CACHE_DIR"])
        assert inside != tmp_path and inside.is_dir() and not any(inside.iterdir())
    assert os.environ["TKC_CACHE_DIR"] == str(tmp_path) and not inside.exists()
