"""ptxas: the search order, the -v report, and errors that quote ptxas instead of a traceback."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from tkc.codegen import ptxas as ptxas_mod
from tkc.codegen.ptxas import assemble, find_ptxas, parse_usage, ptxas_version, require_ptxas
from tkc.errors import TkcCodegenError, TkcUsageError
from tkc.options import knobs

# Captured from ptxas 13.0.88 -arch=sm_90a -v.
LOG_OK = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'k' for 'sm_90a'
ptxas info    : Function properties for k
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 168 registers, used 1 barriers, 8200 bytes smem
ptxas info    : Compile time = 71.809 ms
"""
LOG_C7508 = """\
ptxas info    : (C7508) Potential Performance Loss: 'setmaxnreg' ignored; unable to determine register count at entry.
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'k' for 'sm_90a'
ptxas info    : Function properties for k
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 58 registers, used 1 barriers, 8200 bytes smem
ptxas info    : Compile time = 16.437 ms
"""
LOG_SPILL_TWO_KERNELS = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 't2' for 'sm_90a'
ptxas info    : Function properties for t2
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 4 registers, used 0 barriers
ptxas info    : Compile time = 6.492 ms
ptxas info    : Compiling entry function 's' for 'sm_90a'
ptxas info    : Function properties for s
    72 bytes stack frame, 68 bytes spill stores, 68 bytes spill loads
ptxas info    : Used 24 registers, used 0 barriers, 72 bytes cumulative stack size
ptxas info    : Compile time = 12.597 ms
"""

TINY_PTX = """\
.version 8.0
.target sm_90a
.address_size 64
.visible .entry tiny(.param .u64 p)
{
  .reg .b64 %rd<3>;
  ld.param.u64 %rd1, [p];
  cvta.to.global.u64 %rd2, %rd1;
  st.global.u32 [%rd2], 7;
  ret;
}
"""


# --------------------------------------------------------------------------- -v parsing


def test_parse_usage_one_kernel() -> None:
    kernels, warnings = parse_usage(LOG_OK)
    k = kernels["k"]
    assert (k.registers, k.barriers, k.smem, k.stack_frame, k.spill_stores, k.spill_loads) == (168, 1, 8200, 0, 0, 0)
    assert k.lines[0] == "ptxas info    : Compiling entry function 'k' for 'sm_90a'"
    assert warnings == ()
    assert str(k) == "k: 168 registers, 8200 B smem, 0 B stack, 0 B spill stores, 0 B spill loads"


def test_parse_usage_keeps_c7508() -> None:
    kernels, warnings = parse_usage(LOG_C7508)
    assert kernels["k"].registers == 58
    assert len(warnings) == 1 and "(C7508)" in warnings[0] and "'setmaxnreg' ignored" in warnings[0]


def test_parse_usage_spills_and_two_kernels() -> None:
    kernels, _ = parse_usage(LOG_SPILL_TWO_KERNELS)
    assert set(kernels) == {"t2", "s"}
    s = kernels["s"]
    assert (s.registers, s.stack_frame, s.spill_stores, s.spill_loads, s.smem) == (24, 72, 68, 68, 0)
    assert kernels["t2"].registers == 4 and kernels["t2"].spill_stores == 0


# --------------------------------------------------------------------------- search order


def _exe(path: Path, body: str = "exit 0") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.fixture
def places(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """A fake ptxas in every place find_ptxas looks, in search order; nothing real is reachable."""
    site = tmp_path / "site-packages"
    monkeypatch.setattr(ptxas_mod, "_site_dirs", lambda: [site])
    monkeypatch.setattr(ptxas_mod, "CUDA_DEFAULT", tmp_path / "usr-local-cuda" / "bin")
    return {
        "TKC_PTXAS": _exe(tmp_path / "chosen" / "ptxas"),
        "PATH": _exe(tmp_path / "path" / "ptxas"),
        "CUDA_HOME": _exe(tmp_path / "cuda-home" / "bin" / "ptxas"),
        "default": _exe(tmp_path / "usr-local-cuda" / "bin" / "ptxas"),
        "cu13": _exe(site / "nvidia" / "cu13" / "bin" / "ptxas"),
        "cuda_nvcc": _exe(site / "nvidia" / "cuda_nvcc" / "bin" / "ptxas"),
    }


def test_find_ptxas_order(places: dict[str, Path], tmp_path: Path) -> None:
    env = {"TKC_PTXAS": str(places["TKC_PTXAS"]), "PATH": str(tmp_path / "path"),
           "CUDA_HOME": str(tmp_path / "cuda-home")}
    order = ["TKC_PTXAS", "PATH", "CUDA_HOME", "default", "cu13", "cuda_nvcc"]
    for i, key in enumerate(order):
        assert find_ptxas(env) == places[key], key
        if i < 3:
            env.pop(key)
        else:
            places[key].unlink()
    assert find_ptxas(env) is None


def test_not_executable_is_skipped(places: dict[str, Path], tmp_path: Path) -> None:
    places["CUDA_HOME"].chmod(0o644)
    env = {"CUDA_HOME": str(tmp_path / "cuda-home")}
    assert find_ptxas(env) == places["default"]


def test_bad_tkc_ptxas_is_a_usage_error(places: dict[str, Path], tmp_path: Path) -> None:
    assert knobs({"TKC_PTXAS": "~/x/ptxas"}).ptxas == Path("~/x/ptxas").expanduser()
    with pytest.raises(TkcUsageError, match="TKC_PTXAS='.*nope' is not an executable file"):
        find_ptxas({"TKC_PTXAS": str(tmp_path / "nope")})


def test_no_ptxas_names_the_places_and_the_fix(places: dict[str, Path]) -> None:
    for p in places.values():
        p.unlink()
    assert find_ptxas({}) is None
    with pytest.raises(TkcUsageError) as e:
        assemble(TINY_PTX, "sm_90a", env={})
    msg = str(e.value)
    assert msg.startswith("error: no ptxas found; searched:")
    for where in ("TKC_PTXAS", "PATH", "$CUDA_HOME/bin (CUDA_HOME unset)", "usr-local-cuda",
                  "nvidia/cu13/bin/ptxas", "nvidia/cuda_nvcc/bin/ptxas", "pip install nvidia-cuda-nvcc"):
        assert where in msg
    with pytest.raises(TkcUsageError, match="no ptxas found"):
        require_ptxas({})


def test_ptxas_failure_quotes_ptxas_and_the_ptx_line(tmp_path: Path) -> None:
    # A stand-in ptxas that fails like the real one: "ptxas FILE, line N; error : ...".
    fake = _exe(tmp_path / "ptxas", 'echo "ptxas $3, line 4; error   : Unknown symbol \'q\'" >&2\n'
                                    'echo "ptxas fatal   : Ptx assembly aborted due to errors" >&2\nexit 255')
    with pytest.raises(TkcCodegenError) as e:
        assemble(TINY_PTX, "sm_90a", env={"TKC_PTXAS": str(fake)})
    msg = str(e.value)
    assert "ptxas -arch=sm_90a rejected the PTX:" in msg
    assert "PTX line 4: error: Unknown symbol 'q'\n    .visible .entry tiny(.param .u64 p)" in msg
    assert "tkc-ptxas-" not in msg  # the temp path is not shown
    assert "Traceback" not in msg


# --------------------------------------------------------------------------- the real ptxas


def test_assemble_tiny(ptxas: Path) -> None:
    a = assemble(TINY_PTX, "sm_90a")
    assert a.cubin[:4] == b"\x7fELF" and a.arch == "sm_90a" and a.ptxas == ptxas
    assert a.kernels["tiny"].spill_stores == 0 and a.kernels["tiny"].registers > 0
    assert a.warnings == ()
    quiet = assemble(TINY_PTX, "sm_90a", verbose=False)
    assert quiet.kernels == {} and quiet.cubin[:4] == b"\x7fELF"
    assert ptxas_version(ptxas)[0].isdigit()


def test_the_same_text_assembles_once(tmp_path: Path) -> None:
    # Stand-in ptxases that count their runs; the good one writes a cubin-like file at -o's path.
    count = tmp_path / "runs"
    good = _exe(tmp_path / "good" / "ptxas",
                f'echo run >> {count}\nwhile [ "$1" != "-o" ]; do shift; done\nprintf "\\177ELF" > "$2"')
    bad = _exe(tmp_path / "bad" / "ptxas", f"echo run >> {count}\nexit 1")
    env = {"TKC_PTXAS": str(good)}
    first = assemble(TINY_PTX, "sm_90a", verbose=False, env=env)
    assert first.cubin == b"\x7fELF" and assemble(TINY_PTX, "sm_90a", verbose=False, env=env) is first
    assert count.read_text().count("run") == 1
    assemble(TINY_PTX + "\n", "sm_90a", verbose=False, env=env)   # another text
    assemble(TINY_PTX, "sm_100a", verbose=False, env=env)          # another arch
    assemble(TINY_PTX, "sm_90a", verbose=True, env=env)            # another report
    assert count.read_text().count("run") == 4
    for _ in range(2):  # a failure is not kept: each call runs ptxas again
        with pytest.raises(TkcCodegenError):
            assemble(TINY_PTX, "sm_90a", verbose=False, env={"TKC_PTXAS": str(bad)})
    assert count.read_text().count("run") == 6


def test_real_ptxas_error(ptxas: Path) -> None:
    bad = TINY_PTX.replace("st.global.u32 [%rd2], 7;", "setmaxnreg.inc.sync.aligned.u32 233;")
    with pytest.raises(TkcCodegenError) as e:
        assemble(bad, "sm_90a")
    msg = str(e.value)
    assert "PTX line 9: error:" in msg and "expected to be multiple of 8" in msg
    assert "    setmaxnreg.inc.sync.aligned.u32 233;" in msg


def test_assemble_unknown_arch_is_refused() -> None:
    with pytest.raises(TkcUsageError, match="unknown target 'sm_89'"):
        assemble(TINY_PTX, "sm_89")
