"""allocate-smem's failures and overrides (the placements are FileCheck cases next to this file)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tkc.pins import Options
from tkc.target import DEFAULT_TARGET, TARGETS
from tkc.errors import TkcPassError
from tkc.ir.parser import parse_module
from tkc.ir.verifier import verify
from tkc.passes.allocate_smem import allocate_smem
from tkc.passes.manager import PassManager

HERE = Path(__file__).parent
DATA = HERE.parents[1] / "data" / "hopper"
GEMM = DATA / "gemm.tkir"
TILE = "tile<{r}x64xbf16, smem, #smem<{r}x64xbf16, k, sw128>>"


def kernel(rows: list[int], offsets: list[int] | None = None, barriers: int = 0) -> str:
    """Shared tiles of ``rows`` x 64 bf16, all live at once (those of 64-row multiples are
    written; the others are never used, which does not let them share bytes either)."""
    offsets = offsets or [-1] * len(rows)
    lines = ["tile.kernel @big {threads = 128} {", "^(%o: tensor<bf16[M, N]>):"]
    for i, (r, off) in enumerate(zip(rows, offsets)):
        lines.append(f'  %t{i} = hopper.smem_alloc {{offset = {off}}} : {TILE.format(r=r)} loc("big.tkir":{i + 3}:3)')
    for i in range(barriers):
        lines.append(f"  %bar{i} = hopper.mbarrier_alloc {{offset = -1}} : mbarrier")
        lines.append(f"  hopper.mbarrier_init %bar{i} {{count = 1}}")
    stored = [i for i, r in enumerate(rows) if r % 64 == 0]
    for i in stored:
        r = rows[i]
        lines.append(f"  %v{i} = tile.constant {{value = 0.0}} : "
                     f"tile<{r}x64xbf16, reg, #blocked<{r}x64, vec=8, lanes=4x8, warps=4x1>>")
    for i in stored:
        lines.append(f"  hopper.smem_store %v{i}, %t{i}")
    lines += ["  tile.return", "}"]
    return "\n".join(lines) + "\n"


def test_capacity_is_the_targets() -> None:
    assert TARGETS["sm_90a"].max_smem_bytes == 227 * 1024 == 232448


def test_too_much_shared_memory_names_the_tiles_largest_first() -> None:
    # 128 B per row: 8 + 128 + 64 + 32 KB and two barriers > 227 KB.
    m = parse_module(kernel([64, 1024, 512, 256], barriers=2), "big.tkir")
    with pytest.raises(TkcPassError) as e:
        allocate_smem(m, Options(), DEFAULT_TARGET)
    msg = e.value.message
    assert msg.startswith("kernel 'big' needs 237584 B of shared memory, sm_90a has 232448: ")
    assert msg.index("%t1 131072 B (a 1024x64 bf16 tile)") < msg.index("%t2 65536 B") < msg.index("%t3 32768 B") \
        < msg.index("%t0 8192 B") < msg.index("2 mbarriers 16 B")
    assert msg.endswith("; use smaller tiles (the constants that size them)")
    assert e.value.loc is not None
    # Nothing was half-written: the offsets are still unplaced.
    assert all(op.attributes["offset"] == -1 for op in m.walk() if op.name == "hopper.smem_alloc")


def test_exactly_full_fits() -> None:
    m = parse_module(kernel([1024, 512, 256, 24]), "big.tkir")  # 128 + 64 + 32 + 3 KB = 227 KB
    allocate_smem(m, Options(), DEFAULT_TARGET)
    assert m.kernel().attributes["smem_bytes"] == 232448


def test_through_the_pass_manager_the_error_is_located() -> None:
    m = parse_module(kernel([1024, 1024]), "big.tkir")
    with pytest.raises(TkcPassError) as e:
        PassManager("allocate-smem").run(m)
    # What the kernel asks for is the message, at its largest tile's line (the first of the two
    # equal ones); no reproducer: nothing crashed.
    assert str(e.value).startswith("big.tkir:3:3: error: kernel 'big' needs 262144 B")
    assert "reproducer" not in str(e.value)


def test_hand_placed_offsets_are_kept() -> None:
    m = parse_module(kernel([64, 64, 64], offsets=[8192, -1, -1]), "big.tkir")
    allocate_smem(m, Options(), DEFAULT_TARGET)
    verify(m)
    offsets = [op.attributes["offset"] for op in m.walk() if op.name == "hopper.smem_alloc"]
    assert offsets == [8192, 0, 16384]
    assert m.kernel().attributes["smem_bytes"] == 24576


def test_hand_placed_offsets_that_collide_are_an_error() -> None:
    m = parse_module(kernel([64, 128], offsets=[0, 1024 * 4]), "big.tkir")
    with pytest.raises(TkcPassError, match=r"%t1 \(offset 4096, 16384 B\) overlaps %t0 \(offset 0, 8192 B\)"):
        allocate_smem(m, Options(), DEFAULT_TARGET)


def test_the_hand_written_gemm_is_a_fixed_point() -> None:
    text = GEMM.read_text()
    m = parse_module(text, str(GEMM))
    allocate_smem(m, Options(), DEFAULT_TARGET)
    assert m.kernel().attributes["smem_bytes"] == 32776
    offsets = [op.attributes["offset"] for op in m.walk() if op.name.endswith("_alloc")]
    assert offsets == [0, 16384, 32768]


@pytest.mark.parametrize("name", ["gemm_ring.tkir", "gemm_ws.tkir"])
def test_the_hand_written_rings_are_placed_as_written(name: str) -> None:
    # The two 4-stage tile rings (64 KB each) back to back, then the full and empty barrier
    # rings (32 B each): what pipeline-loops and specialize-warps output gets from this pass.
    text = (DATA / name).read_text()
    written = [int(x) for x in re.findall(r"_alloc \{offset = (\d+)", text)]
    unplaced = re.sub(r"(_alloc \{offset = )\d+", r"\g<1>-1", text).replace(", smem_bytes = 131136", "")
    m = parse_module(unplaced, name)
    allocate_smem(m, Options(), DEFAULT_TARGET)
    verify(m)
    offsets = [op.attributes["offset"] for op in m.walk() if op.name.endswith("_alloc")]
    assert offsets == written == [0, 65536, 131072, 131104]
    assert m.kernel().attributes["smem_bytes"] == 131136


def test_a_ring_too_large_names_its_stages() -> None:
    text = """tile.kernel @rings {threads = 128} {
^(%o: tensor<bf16[M, N]>):
  %r = hopper.smem_alloc {offset = -1, stages = 8} : tile<256x64xbf16, smem, #smem<256x64xbf16, k, sw128>>
  %b = hopper.mbarrier_alloc {offset = -1, stages = 8} : mbarrier
  hopper.mbarrier_init %b {count = 1}
  tile.return
}
"""
    with pytest.raises(TkcPassError, match=r"needs 262208 B of shared memory, sm_90a has 232448: %r 262144 B "
                                           r"\(8 stages of a 256x64 bf16 tile\), 8 mbarriers 64 B; use smaller "
                                           r"tiles \(the constants that size them\) or fewer stages \(-D stages=2\)\n"):
        allocate_smem(parse_module(text, "rings.tkir"), Options(), DEFAULT_TARGET)
