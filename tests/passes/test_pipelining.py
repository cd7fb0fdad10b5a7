"""pipeline-loops and specialize-warps on the examples: the ring and the roles they build,
their pins, and that the output verifies and round-trips.  What the kernels compute is
checked in the emulator (tests/emulator) and on the GPU (tests/gpu)."""

from __future__ import annotations

import pathlib
import re

import pytest

from tkc.errors import TkcUnsupportedError
from tkc.frontend import compile_file, compile_source
from tkc.ir.parser import parse_module
from tkc.ir.printer import print_module
from tkc.ir.verifier import verify
from tkc.passes.manager import PassManager
from tkc.passes.pipeline import DEFAULT_PIPELINE

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"
RING = "select-layouts,lower-to-hopper,pipeline-loops"
SPLIT = RING + ",specialize-warps"


def lowered(name: str, consts: dict, passes: str, source: str | None = None) -> str:
    m = compile_source(source, name) if source else compile_file(str(EXAMPLES / name), consts)
    PassManager(DEFAULT_PIPELINE + "," + passes).run(m)
    text = print_module(m, locs=False)
    again = parse_module(text)
    verify(again)
    assert print_module(again, locs=False) == text
    return text


def role(text: str, name: str) -> str:
    start = text.index(f'hopper.role {{name = "{name}"')
    depth, i = 0, text.index("{", text.index("}", start))
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[start:j]
    raise AssertionError("unbalanced role")


def test_gemm_ring():
    text = lowered("gemm.tk", {"BN": 128}, RING)
    assert re.search(r"hopper.smem_alloc \{offset = -1, stages = 4\} : tile<128x64xbf16", text)
    assert re.search(r"hopper.smem_alloc \{offset = -1, stages = 4\} : tile<64x128xbf16", text)
    assert "hopper.mbarrier_init %empty {count = 2}" in text  # both warpgroups release a stage
    assert "hopper.mbarrier_init %a_b_full {count = 1}" in text  # a and b are read by one wgmma
    assert "bytes = 32768" in text
    loop = text[text.index("%acc_1 = tile.for"):]
    assert "hopper.barrier" not in loop, "the ring replaces the loop's bar.sync"
    assert "phase" in loop and not re.search(r"\^\(%k: i32, [^)]*, %phase", loop), "no carried parity"
    # Wait for k's stage, issue its wgmma, wait for k-1's wgmma and release k-1's stage, then
    # refill that stage with k+3; the accumulator is read only behind the loop.
    order = [loop.index(s) for s in ("hopper.mbarrier_wait %", "hopper.wgmma %", "hopper.wgmma_wait_group "
                                     "{pending = 1}", "tile.cmp %k, %", "hopper.mbarrier_arrive",
                                     "tile.add %k, %", "hopper.expect_tx", "tile.yield %")]
    assert order == sorted(order)
    assert re.search(r"tile.yield %\d+\n  \}\n  %\d+ = hopper.wgmma_wait %acc_1 \{pending = 0\}", loop)


def test_attention_ring_waits_for_each_tensor_before_its_use():
    text = lowered("attn.tk", {"tma_store": False}, RING)
    # k, v tiles; k_empty, v_empty, k_full, v_full: D=128 leaves room for 3
    assert text.count("stages = 3") == 6
    # Storing O through a shared tile (TMA) takes 32 KB of that room: two stages.
    assert lowered("attn.tk", {}, RING).count("stages = 2") == 6
    loop = text[text.index("= tile.for", text.index("%m_i =")):]
    k_wait, first_mma = loop.index("hopper.stage %k_full, %stage"), loop.index("hopper.wgmma %")
    v_wait, second_mma = loop.index("hopper.stage %v_full, %stage"), loop.index("hopper.wgmma %", first_mma + 1)
    assert k_wait < first_mma < v_wait < second_mma
    # K's stage is released once S has been waited for, V's once P V has: each on its own ring,
    # so the refill of K need not wait for P V.
    waits = [m.start() for m in re.finditer(r"hopper.wgmma_wait %", loop)]
    k_free, v_free = loop.index("hopper.stage %k_empty, %stage"), loop.index("hopper.stage %v_empty, %stage")
    assert waits[0] < k_free < v_wait and waits[1] < v_free
    assert "hopper.mbarrier_init %k_empty {count = 2}" in text and "hopper.mbarrier_init %v_empty {count = 2}" in text


@pytest.mark.parametrize("stages,expect", [(2, 2), (3, 3), (1, None)])
def test_stages_pin(stages, expect):
    text = lowered("gemm.tk", {}, RING, (EXAMPLES / "gemm.tk").read_text().replace(
        "BK: const = 64)", f"BK: const = 64, stages: const = {stages})"))
    if expect is None:
        assert "offset = -1, stages" not in text
        assert "hopper.barrier {id = 0}" in text[text.index("= tile.for"):]
    else:
        assert f"stages = {expect}" in text


def test_gemm_roles():
    text = lowered("gemm.tk", {}, SPLIT)
    assert "threads = 384" in text
    producer, consumers = role(text, "producer"), role(text, "consumers")
    assert 'first = 0, warpgroups = 1, regs = 24, warps = 1' in producer  # its first warp issues the copies
    assert 'first = 1, warpgroups = 2, regs = 240' in consumers
    assert "hopper.tma_load" in producer and "hopper.expect_tx" in producer and "hopper.wgmma" not in producer
    assert "hopper.tma_load" not in consumers and "hopper.expect_tx" not in consumers
    assert "hopper.wgmma" in consumers and "hopper.mbarrier_arrive" in consumers and "hopper.tma_store" in consumers
    assert ", reg, #" not in producer, "the producer holds no register tile"


@pytest.mark.parametrize("consumers, ctas, regs", [(1, 1, 240), (2, 1, 240), (3, 1, 160), (4, 1, 112),
                                                 (1, 2, 232), (2, 2, 104)])
def test_consumer_budgets_fit_what_the_cta_holds(consumers, ctas, regs):
    """The consumers' budget is what is left of the CTA's launch allocation once the producer
    holds 24, a multiple of 8: 640 threads (four consumers) start at 96 each, 61440 registers,
    where the register file's 65536 would give 120 and a setmaxnreg.inc that never returns."""
    from tkc.passes.specialize_warps import PRODUCER_REGS, consumer_regs
    from tkc.registers import register_pool
    from tkc.target import DEFAULT_TARGET

    assert consumer_regs(consumers, ctas, DEFAULT_TARGET) == regs
    pool = register_pool(128 * (consumers + 1), ctas, DEFAULT_TARGET)
    assert 128 * (PRODUCER_REGS + consumers * regs) <= pool  # setmaxnreg.inc gets what it asks for
    if regs < 240:  # not capped: 8 more each would not fit
        assert 128 * (PRODUCER_REGS + consumers * (regs + 8)) > pool


def test_four_consumers_ask_for_what_the_pool_has():
    text = lowered("gemm.tk", {"BM": 256, "BN": 128}, SPLIT)
    assert "threads = 640" in text and 'first = 1, warpgroups = 4, regs = 112' in role(text, "consumers")


def test_attention_roles_and_the_q_tile():
    text = lowered("attn.tk", {"D": 64}, SPLIT)
    producer, consumers = role(text, "producer"), role(text, "consumers")
    assert "hopper.tma_load %q" in producer and "hopper.tma_load %k" in producer
    assert "hopper.reduce" in consumers and "hopper.tma_store %o" in consumers


def test_an_if_of_scalars_before_the_roles_is_both_roles():
    """A causal attn_fwd launched longest first picks its tile in an if (persistent's
    ``_longest_first``): every warpgroup computes it before the roles part."""
    text = lowered("attn_train.tk", {"causal": True, "persistent": False}, "persistent," + SPLIT)
    text = text[text.index("tile.kernel @attn_fwd"):text.index("tile.kernel @attn_bwd_pre")]
    before = text[:text.index("hopper.role")]
    assert "%tile_row, %tile_col = tile.if" in before
    producer, consumers = role(text, "producer"), role(text, "consumers")
    assert "hopper.tma_load %q" in producer and "hopper.tma_store %o" in consumers
    assert "tile.if" not in producer.split("tile.for")[0]  # computed once, before the roles


def test_an_if_of_scalars_in_a_walk_is_the_producers_too():
    """With longest_first pinned off the persistent walk has no such if; a kernel that picks its
    tile in an if of scalars inside the walk (the order written in the kernel) still gets a
    producer, which computes its own copy, and Q's copy still goes a tile ahead."""
    src = (EXAMPLES / "attn.tk").read_text().replace(
        "    i = program_id(0)\n",
        "    i = program_id(0)\n    if N > 4096:\n        i = cdiv(N, BM) - 1 - program_id(0)\n")
    src = src.replace("causal: const = False", "causal: const = True, persistent: const = True")
    text = lowered("attn", {}, "persistent," + SPLIT, source=src)
    producer = role(text, "producer")
    assert "tile.if" in producer and "hopper.tma_load %q" in producer


def test_warp_specialize_pin_off():
    src = (EXAMPLES / "gemm.tk").read_text().replace(
        "BK: const = 64)", "BK: const = 64, warp_specialize: const = False)")
    text = lowered("gemm.tk", {}, SPLIT, src)
    # 4 stages of 48 KB: the epilogue goes out in 64-column slices through two 16 KB tiles.
    assert "hopper.role" not in text and "stages = 4" in text and "threads = 256" in text


def test_consumers_pin_must_match_the_rows():
    src = (EXAMPLES / "gemm.tk").read_text().replace("BK: const = 64)", "BK: const = 64, consumers: const = 3)")
    with pytest.raises(TkcUnsupportedError, match=r"consumers = 3: this kernel's products have 128 rows"):
        lowered("gemm.tk", {}, SPLIT, src)


@pytest.mark.parametrize("name", ["softmax.tk", "layernorm.tk"])
def test_kernels_without_copies_in_loops_stay_single_role(name):
    text = lowered(name, {}, SPLIT)
    assert "hopper.role" not in text and "stages" not in text


def test_pins_need_no_declaration():
    """-D stages=2 / persistent=false reach the passes of a kernel that does not declare them."""
    from tkc.compiler import compile_kernel

    c = compile_kernel(EXAMPLES / "gemm.tk", {"stages": 2, "persistent": False, "warp_specialize": False},
                       stop="hopper", cache=False)
    text = c.asm["hopper"]
    assert "stages = 2}" in text and "hopper.role" not in text and "tile.num_sms" not in text


def test_bad_pin_value():
    from tkc.compiler import compile_kernel
    from tkc.errors import TkcUsageError

    with pytest.raises(TkcUsageError, match="pin stages = 0: expected a positive integer"):
        compile_kernel(EXAMPLES / "gemm.tk", {"stages": 0}, stop="tkir", cache=False)


def _turns(loop: str) -> list[str]:
    return re.findall(r'hopper.turn \{kind = "(\w+)"\}|(hopper.wgmma) %', loop)


def test_attention_consumers_take_turns_around_each_wgmma():
    consumers = role(lowered("attn.tk", {"pingpong": True}, SPLIT), "consumers")
    seq = [kind or op for kind, op in _turns(consumers)]
    assert seq == ["start", "wait", "hopper.wgmma", "pass", "wait", "hopper.wgmma", "pass", "end"]
    loop = consumers[consumers.index("= tile.for"):]
    # The turn is taken after the ring stage is there, and passed before the wgmma is waited for.
    assert loop.index("hopper.mbarrier_wait") < loop.index('kind = "wait"')
    assert loop.index('kind = "pass"') < loop.index("hopper.wgmma_wait")


def test_gemm_consumers_do_not_take_turns_unless_pinned():
    assert "hopper.turn" not in lowered("gemm.tk", {}, SPLIT)
    text = lowered("gemm.tk", {"pingpong": True}, SPLIT)
    assert [k or o for k, o in _turns(role(text, "consumers"))] == ["start", "wait", "hopper.wgmma", "pass", "end"]


def test_pingpong_pin():
    assert "hopper.turn" not in lowered("attn.tk", {}, SPLIT)  # off by default
    assert "hopper.turn" not in lowered("attn.tk", {"pingpong": False}, SPLIT)
    with pytest.raises(TkcUnsupportedError, match="pingpong = true takes turns between two consumer warpgroups"):
        lowered("attn.tk", {"BM": 64, "pingpong": True}, SPLIT)


def test_a_turn_outside_a_two_warpgroup_role_is_refused():
    from tkc.errors import TkcVerifyError

    text = lowered("gemm.tk", {"BM": 64, "BN": 64}, SPLIT)  # one consumer warpgroup
    line = re.search(r"\n( *)\S+ = hopper.wgmma_wait", text)
    bad = text[:line.start()] + f'\n{line[1]}hopper.turn {{kind = "wait"}}' + text[line.start():]
    with pytest.raises(TkcVerifyError, match="takes turns between the two warpgroups of a role"):
        verify(parse_module(bad))


AHEAD = SPLIT + ",issue-ahead"


def test_issue_ahead_moves_the_next_score_product_before_the_softmax():
    consumers = role(lowered("attn.tk", {"issue_ahead": True}, AHEAD), "consumers")
    # Before the loop: the first block's ring wait and S product, under lb < ub.
    loop = consumers.index("= tile.for")
    assert re.search(r"tile.if %\d+ :", consumers[:loop])
    assert "hopper.mbarrier_wait" in consumers[:loop] and "hopper.wgmma %q_smem" in consumers[:loop]
    # In the loop: wait for this block's S (carried), issue the next block's, then the softmax.
    body = consumers[loop:]
    order = [body.index(t) for t in ("hopper.wgmma_wait %ahead", "hopper.wgmma %q_smem", "hopper.reduce")]
    assert order == sorted(order)
    # S issued twice (before the loop, in it), waited twice (in the loop, for the last block
    # after it); P @ V once in the loop and once for the last block.
    assert consumers.count("hopper.wgmma %q_smem") == 2
    assert consumers.count("hopper.wgmma %") == 4 and consumers.count("hopper.wgmma_wait") == 4


def test_issue_ahead_leaves_loops_alone_without_the_pin_or_a_producer():
    assert "%ahead" not in lowered("attn.tk", {}, AHEAD)
    assert "%ahead" not in lowered("attn.tk", {"issue_ahead": True, "warp_specialize": False}, AHEAD)
    # GEMM's product reads the carried accumulator: nothing to issue ahead.
    assert "%ahead" not in lowered("gemm.tk", {"issue_ahead": True}, AHEAD)


def test_issue_ahead_moves_the_turn_around_the_score_product():
    """With pingpong, S's turn goes where S goes: before the loop for block 0, and in the loop
    right after the wait for block j's S; P @ V keeps its own turn.  Every S and every P @ V
    is issued between a turn wait and a pass, and the waits and passes alternate."""
    consumers = role(lowered("attn.tk", {"issue_ahead": True, "pingpong": True}, AHEAD), "consumers")
    loop = consumers.index("= tile.for")
    before, body = consumers[:loop], consumers[loop:]
    assert re.search(r'hopper.turn \{kind = "wait"\}\s*\n\s*%\S+ = hopper.wgmma %q_smem', before)
    order = [body.index(t) for t in ("hopper.wgmma_wait %ahead", 'hopper.turn {kind = "wait"}', "hopper.wgmma %q_smem",
                                     'hopper.turn {kind = "pass"}', "hopper.reduce")]
    assert order == sorted(order)
    turns = re.findall(r'hopper.turn \{kind = "(\w+)"\}', consumers)
    assert turns[0] == "start" and turns[-1] == "end"
    inner = turns[1:-1]
    assert inner == ["wait", "pass"] * (len(inner) // 2) and len(inner) == 2 * consumers.count("hopper.wgmma %")
    for m in re.finditer(r"= hopper.wgmma %", consumers):
        last_wait = consumers.rfind('hopper.turn {kind = "wait"}', 0, m.start())
        assert last_wait > consumers.rfind('hopper.turn {kind = "pass"}', 0, m.start())



DEFER = SPLIT + ",defer-last"


def test_defer_last_issues_the_previous_pv_right_after_the_next_s():
    """FlashAttention-3's order: before the loop, block 0 up to its P and rescaled O; in the
    loop, S of block j and P V of block j - 1 issued back to back, S waited for with P V left
    in flight (K's stage released), the softmax, then P V waited for and V's stage released
    before O is rescaled; behind the loop the last block's P V."""
    consumers = role(lowered("attn.tk", {"defer_last": True}, DEFER), "consumers")
    loop = consumers.index("= tile.for")
    line = consumers.rindex("\n", 0, loop) + 1
    end = consumers.index("\n" + " " * (len(consumers[line:loop]) - len(consumers[line:loop].lstrip())) + "}", loop)
    before, body, after = consumers[:loop], consumers[loop:end], consumers[end:]
    assert before.count("hopper.wgmma %q_smem") == 1 and "hopper.wgmma %q_smem" not in after
    assert re.search(r"= hopper.wgmma %\w+, %\w+, %\w+ : tile<128x128xf32", after), "the last block's P V"
    issued = [m.start() for m in re.finditer(r"= hopper.wgmma %", body)]
    assert len(issued) == 2 and body.index("= hopper.wgmma %q_smem") == issued[0]
    between = body[issued[0]:issued[1]]
    assert "hopper.wgmma_wait" not in between and between.count("\n") == 1, "issued back to back"
    order = [body.index(t) for t in ("{pending = 1}", "hopper.stage %k_empty", "hopper.reduce", "{pending = 0}",
                                     "hopper.stage %v_empty")]
    assert order == sorted(order) and order[-1] < body.rindex("tile.yield")
    # The loop carries P (the P V operand) and the rescaled O instead of O.
    assert re.search(r"\^\(%j\w*: i32, [^)]*: tile<128x128xbf16, reg, #wgmma_a<128, wg=2>>, "
                     r"%\w+: tile<128x128xf32, reg, #wgmma_acc<128, wg=2>>\)", body)


def test_defer_last_leaves_loops_alone_without_the_pin_a_producer_or_two_products():
    for consts, passes, name in (({}, DEFER, "attn.tk"), ({"defer_last": True, "warp_specialize": False}, DEFER,
                                                          "attn.tk"), ({"defer_last": True}, DEFER, "gemm.tk")):
        text = lowered(name, consts, passes)
        loop = text[text.index("= tile.for"):]
        assert "{pending = 1}" not in loop or name == "gemm.tk"
        assert text.count("= hopper.wgmma %") == (2 if name == "attn.tk" else 1), (consts, name)


@pytest.mark.parametrize("name, consts, why", [
    ("attn_fp8.tk", {"transpose_in_producer": False}, "reads no ring stage, only shared tiles rewritten every "
                                                       "iteration"),
    ("gemm.tk", {}, "it issues 1 product; the pin moves the second of a loop's two"),
    ("attn.tk", {"warp_specialize": False}, "the loop issues its own copies")])
def test_defer_last_says_why_it_leaves_a_kernel_as_it_is(name: str, consts: dict, why: str) -> None:
    """A pinned defer_last that changes nothing is a note at each loop with products, never
    silence; where it applies (attn.tk), no note."""
    from tkc.compiler import compile_kernel

    c = compile_kernel(EXAMPLES / name, {**consts, "defer_last": True}, stop="hopper", cache=False)
    assert len(c.remarks) == 1 and why in c.remarks[0] and "note: defer_last = true leaves this loop as it is" \
        in c.remarks[0], c.remarks
    loop_line = int(c.remarks[0].split(":")[1])
    assert (EXAMPLES / name).read_text().splitlines()[loop_line - 1].lstrip().startswith("for "), c.remarks
    assert compile_kernel(EXAMPLES / "attn.tk", {"defer_last": True}, stop="hopper", cache=False).remarks == ()


def test_defer_last_takes_one_turn_for_both_products_under_pingpong():
    """With pingpong, the loop issues S of block j and P V of block j - 1 in one turn; block 0's
    S and the last block's P V take a turn each, so both warpgroups take the same turns."""
    consumers = role(lowered("attn.tk", {"defer_last": True, "pingpong": True}, DEFER), "consumers")
    turns = re.findall(r'hopper.turn \{kind = "(\w+)"\}', consumers)
    assert turns[0] == "start" and turns[-1] == "end"
    inner = turns[1:-1]
    assert inner == ["wait", "pass"] * 3
    assert re.search(r'hopper.turn \{kind = "wait"\}\s*\n\s*%\S+ = hopper.wgmma %q_smem[^\n]*\n\s*%\S+ = '
                     r'hopper.wgmma %[^\n]*\n\s*hopper.turn \{kind = "pass"\}', consumers)


def test_defer_last_and_issue_ahead_are_refused_together():
    with pytest.raises(TkcUnsupportedError, match="defer_last = true and issue_ahead = true"):
        lowered("attn.tk", {"defer_last": True, "issue_ahead": True}, DEFER)


@pytest.mark.parametrize("consts, kv, q_stages", [({"D": 128, "tma_store": False}, 2, 2), ({"D": 128}, 2, 2),
                                                 ({"D": 128, "BN": 96}, 2, 2), ({"D": 64}, 4, 2),
                                                 ({"D": 256, "BN": 64}, 2, 1)])
def test_persistent_attention_rings_q_per_tile(consts, kv, q_stages):
    """A persistent attention program loads a Q tile per output tile: the inner K/V ring takes
    the shared memory first, but leaves Q its second stage (the next tile's Q lands during
    this tile's loop) before taking a third (D=128 with per-thread O stores or 96-key blocks:
    K/V 2 and Q 2, not K/V 3 and Q 1); Q gets a ring of what is left, one stage at D=256, so a
    producer can still issue every copy."""
    text = lowered("attn.tk", {"persistent": True, **consts}, "persistent," + SPLIT)
    tma_store = consts.get("tma_store", True)
    assert re.search(rf"%q_smem = hopper.smem_alloc \{{offset = -1, stages = {q_stages}\}}", text)
    assert re.search(rf"%k_smem = hopper.smem_alloc \{{offset = -1, stages = {kv}\}}", text)
    assert "threads = 384" in text
    producer, consumers = role(text, "producer"), role(text, "consumers")
    assert "hopper.barrier" not in producer + consumers, "no bar.sync left inside the tile loop"
    assert "hopper.tma_load %q" in producer and "hopper.tma_load %k" in producer
    # The consumers wait for the tile's Q, run the K/V loop, then release Q's stage.
    q_wait = consumers.index("hopper.mbarrier_wait %q_full" if q_stages == 1 else "hopper.stage %q_full")
    release = consumers.rindex("hopper.mbarrier_arrive")
    store = consumers.index("hopper.tma_store %o" if tma_store else "hopper.store %o")
    assert q_wait < consumers.index("hopper.wgmma") < release < store


def test_stages_pin_is_for_the_inner_ring():
    """stages = 2 sizes the K/V ring; the per-tile Q ring still takes what is left."""
    text = lowered("attn.tk", {"D": 128, "persistent": True, "stages": 2}, "persistent," + RING)
    assert re.search(r"%k_smem = hopper.smem_alloc \{offset = -1, stages = 2\}", text)
    assert re.search(r"%q_smem = hopper.smem_alloc \{offset = -1, stages = 2\}", text)


def test_persistent_causal_attention_carries_the_ring_count():
    """Causal: the K/V loop's length changes from tile to tile, so the ring's position at a
    tile's start is a count the tile loop carries (0, then + the tile's K/V blocks), in the
    consumers and in the producer, which keeps that one carried value."""
    text = lowered("attn.tk", {"causal": True, "persistent": True}, "persistent," + SPLIT)
    assert "threads = 384" in text
    for name in ("producer", "consumers"):
        body = role(text, name)
        m = re.search(r"= tile.for %\w+, %\w+, %\w+, %\w+ : i32 \{\n\s*\^\(%\w+: i32, %(\w+): i32\)", body)
        assert m, body
        count = m.group(1)
        assert re.search(rf"= tile.add %{count}, %", body), "positions start from the carried count"


def test_persistent_loop_with_varying_inner_bounds_nested_deeper_stays_serial():
    """A ring whose loop sits under a branch of the tile loop cannot carry a count there."""
    src = (EXAMPLES / "attn.tk").read_text().replace(
        "    for j in range(n_kv):", "    if n_kv > 0:\n      for j in range(n_kv):")
    lines = src.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("      for j in range(n_kv):"))
    end = next(i for i, line in enumerate(lines) if line.startswith("    o[b, h"))
    lines[start + 1:end] = ["  " + line for line in lines[start + 1:end]]
    text = lowered("attn.tk", {}, "persistent," + SPLIT, "\n".join(lines).replace(
        "causal: const = False)", "causal: const = True, persistent: const = True)"))
    assert "hopper.role" not in text


def test_attention_d256_stages_o_in_q_when_its_own_tile_would_cost_the_ring():
    # Q 64 KB and two stages of 80-row K and V blocks take 224 KB: a 32 KB staging tile of
    # O's own would leave K and V one stage.  O goes out through Q's bytes instead, after a
    # wait that brings both consumer warpgroups past their last product.
    text = lowered("attn.tk", {"D": 256, "BN": 80}, SPLIT)
    assert "%o_out" not in text
    assert text.count("stages = 2") == 6  # k, v tiles; k_empty, v_empty, k_full, v_full
    assert re.search(r"hopper.tma_store_wait \{pending = 0\}\n\s*hopper.smem_store %\S+, %q_smem\n"
                     r"\s*hopper.tma_store %o, %q_smem", text)
    consumers = text[text.index('hopper.role {name = "consumers"'):]
    assert consumers.index("hopper.wgmma_wait") < consumers.index("hopper.tma_store_wait")
    # Where the bytes are to spare, O keeps a tile of its own (the reuse measured slower).
    assert "%o_out" in lowered("attn.tk", {"D": 256, "BN": 64}, SPLIT)
    assert "%o_out" in lowered("attn.tk", {"D": 128}, SPLIT)
    # A persistent program loads Q in its tile loop, into a ring the producer refills: never
    # O's staging, however short the room (here K and V get no ring at all).
    text = lowered("attn.tk", {"D": 256, "BN": 80, "persistent": True}, "persistent," + SPLIT)
    assert "tma_store %o, %o_out0" in text and "tma_store %o, %q_smem" not in text


TWO_COUNTED_LOOPS = """
@kernel
def two(a: bf16[M, K], b: bf16[K, N], c: bf16[S, M, N], lens: i32[S], BM: const = 64, BN: const = 128,
        BK: const = 64, persistent: const = True):
    grid(cdiv(M, BM), cdiv(N, BN))
    pm = program_id(0)
    pn = program_id(1)
    for s in range(S):
        n = lens[s]
        acc = zeros([BM, BN], f32)
        for j in range(n):
            for k in range(cdiv(K, BK)):
                acc += a[pm*BM:(pm+1)*BM, k*BK:(k+1)*BK] @ b[k*BK:(k+1)*BK, pn*BN:(pn+1)*BN]
        for j in range(n + 1):
            for k in range(cdiv(K, BK)):
                acc += a[pm*BM:(pm+1)*BM, k*BK:(k+1)*BK] @ b[k*BK:(k+1)*BK, pn*BN:(pn+1)*BN]
        c[s, pm*BM:(pm+1)*BM, pn*BN:(pn+1)*BN] = acc.to(bf16)
"""


def test_two_loops_of_varying_length_under_one_loop_count_their_rings_apart() -> None:
    """Each ring's count of earlier iterations goes through the enclosing loops (a rank or
    segment loop inside a persistent tile loop) on a carried value of its own: one shared value
    crashed the pass, and the last loop's count would have started the first ring's next run."""
    import numpy as np

    from tkc.compiler import compile_kernel
    from tkc.interpreter import random_args
    from tkc.runner import run

    tile_ir = compile_kernel(TWO_COUNTED_LOOPS, {}, stop="tkir", cache=False).kernel_op
    # 3 x 2 tiles over the interpreter's 4 programs: some programs run two tiles
    args = random_args(tile_ir, {"M": 150, "K": 96, "N": 200, "S": 3}, 0, (0, 8))
    args[3][:] = np.array([1, 0, 2], np.int32)
    result = run(tile_ir, args, "emulate", check=True)
    assert [m.name for m in result.checked] == ["a", "b", "c", "lens"], result.checked
    assert not [m for m in result.checked if m.bad], result.checked


@pytest.mark.parametrize("first", [True, False])
def test_refill_first_pin_places_the_consumers_refill(first):
    """Without a producer, thread 0 refills the ring at the top of each iteration (its copies
    land while the iteration computes), or last with ``refill_first=false``; a GEMM's K loop,
    whose wgmma stays in flight across iterations, refills last either way."""
    text = lowered("attn_train.tk", {"D": 128, "refill_first": first, "warp_specialize": False}, RING)
    body = text[text.index("@attn_bwd "):]
    loop = body[body.index("%dk_acc_1 = tile.for"):]
    refill, first_product = loop.index("hopper.tma_load %q"), loop.index("hopper.wgmma")
    assert (refill < first_product) == first
    gemm = lowered("gemm.tk", {"BN": 128, "warp_specialize": False}, RING)
    k_loop = gemm[gemm.index("%acc_1 = tile.for"):]
    assert k_loop.index("hopper.wgmma %") < k_loop.index("hopper.tma_load")


@pytest.mark.parametrize("consts, q_stages", [({"D": 128}, 2), ({"D": 128, "outer_stages": 1}, 1),
                                              ({"D": 256, "causal": True}, 1)])
def test_outer_stages_pin_sets_the_per_tile_q_ring(consts, q_stages):
    """A persistent program's Q ring around the K/V ring: 2 stages where shared memory allows (D =
    256 leaves room for one), 1 with the pin."""
    text = lowered("attn.tk", {**consts, "persistent": True}, "persistent," + SPLIT)
    assert re.search(rf"%q_smem = hopper.smem_alloc \{{offset = -1, stages = {q_stages}\}}", text)


UNDER_AN_IF = pathlib.Path(__file__).resolve().parents[1] / "data" / "gemm_under_if.tk"


def test_a_loop_left_serial_under_a_runtime_if_gets_a_remark_at_its_line():
    from tkc.compiler import compile_kernel

    path = UNDER_AN_IF
    c = compile_kernel(path, {}, stop="hopper", cache=False)
    assert len(c.remarks) == 1, c.remarks
    first = c.remarks[0].splitlines()
    assert first[0] == (f"{path}:10:9: note: this loop's tile loads stay one at a time (each waits for the "
                        "iteration before to finish with its tiles): it runs under an if whose condition is known "
                        "only at run time; keep the loop at the top level (or in loops only) and give the programs "
                        "that skip it zero trips")
    assert first[1:] == ["        for k in range(cdiv(K, BK)):", "        ^"]


def test_loads_indexed_by_a_carried_value_stay_serial_with_a_remark_and_compute_right():
    """The interpreter runs it, so the compiler does too (serially), and says why at the loop."""
    from tkc import runner
    from tkc.compiler import compile_kernel
    from tkc.interpreter import random_args

    path = UNDER_AN_IF.parent / "gemm_carried_index.tk"
    c = compile_kernel(path, {}, stop="hopper", cache=False)
    assert len(c.remarks) == 1 and "depend on a value the loop carries" in c.remarks[0], c.remarks
    assert not any(op.attributes.get("stages", 1) > 1 for op in c.kernel_op.walk() if op.name == "hopper.smem_alloc")
    tile_ir = compile_kernel(path, {}, stop="tkir", cache=False).kernel_op
    result = runner.run(tile_ir, random_args(tile_ir, {"M": 130, "N": 128, "K": 200}, 0, (-8, 8)), "emulate",
                        check=True)
    assert result.checked and result.ok, result.checked
    assert result.notes == list(c.remarks)  # what tkc run prints


def test_a_ring_that_does_not_fit_gets_a_remark_unless_stages_is_pinned():
    from tkc.compiler import compile_kernel

    consts = {"BM": 128, "BN": 256, "BK": 256}
    c = compile_kernel(EXAMPLES / "gemm.tk", consts, stop="hopper", cache=False)
    assert len(c.remarks) == 1 and re.search(r"gemm.tk:\d+:\d+: note: this loop's tile loads stay one at a time .*: "
                                             r"two stages of its tiles \(2 x 196608 bytes\) do not fit in the "
                                             r"\d+ bytes of shared memory left", c.remarks[0]), c.remarks
    assert compile_kernel(EXAMPLES / "gemm.tk", {**consts, "stages": 1}, stop="hopper", cache=False).remarks == ()


@pytest.mark.parametrize("name", ["gemm.tk", "attn.tk", "attn_train.tk", "ring_attn.tk", "allgather_gemm.tk"])
def test_the_examples_compile_without_remarks(name):
    from tkc.compiler import compile_kernel

    kernels = re.findall(r"^def (\w+)\(", (EXAMPLES / name).read_text(), re.M)
    for kernel in kernels if name == "attn_train.tk" else [None]:
        assert compile_kernel(EXAMPLES / name, {}, stop="hopper", cache=False, kernel=kernel).remarks == ()


def test_an_outer_stages_pin_that_does_not_fit_is_cut_with_a_remark():
    """D = 256 leaves room for one per-tile Q stage beside the K/V ring: a pin of 2 gets one,
    and says so at the loop rather than silently."""
    from tkc.compiler import compile_kernel

    path = pathlib.Path(__file__).resolve().parents[2] / "examples" / "attn.tk"
    c = compile_kernel(path, {"D": 256, "causal": True, "persistent": True, "outer_stages": 2}, stop="hopper",
                       cache=False)
    assert re.search(r"%q_smem = hopper.smem_alloc \{offset = -?\d+, stages = 1\}", c.asm["hopper"])
    notes = [r for r in c.remarks if "outer_stages = 2 does not fit" in r]
    assert len(notes) == 1 and "1 stage(s)" in notes[0], c.remarks
    fits = compile_kernel(path, {"D": 128, "persistent": True, "outer_stages": 2}, stop="hopper", cache=False)
    assert not [r for r in fits.remarks if "outer_stages" in r]


# A product after the K loop whose B is computed in registers: all consumers store it to shared
# memory, then each reads the whole of it (the barrier between was left before the roles).
REGISTER_B_AFTER_THE_LOOP = """@kernel
def k(xb: bf16[M, N], wb: bf16[N, N], o: f32[G, 128, 16]):
    grid(cdiv(M, 128))
    p = program_id(0)
    r = p * 128
    acc = zeros([128, 128], f32)
    for kk in range(cdiv(N, 32)):
        acc += xb[r:r+128, kk*32:(kk+1)*32] @ wb[kk*32:(kk+1)*32, 0:128]
    o[p, :, :] = acc.to(bf16) @ (wb[0:128, 0:16] * 2.0).to(bf16)
"""


@pytest.mark.parametrize("target", ["sm_90a", "sm_100a"])
def test_a_barrier_after_the_loop_stays_the_consumers(target: str) -> None:
    import numpy as np
    from device_checks import interpret_and_emulate

    from tkc.compiler import compile_kernel
    from tkc.interpreter import random_args

    hopper = compile_kernel(REGISTER_B_AFTER_THE_LOOP, {}, stop="hopper", cache=False, target=target).kernel_op
    roles = [op for op in hopper.walk() if op.name == "hopper.role"]
    assert len(roles) == 2, "warp-specialized"
    consumers = roles[-1] if roles[-1].attributes.get("name") == "consumers" else roles[0]
    assert any(op.name == "hopper.sync" for op in consumers.walk())
    tile_ir = compile_kernel(REGISTER_B_AFTER_THE_LOOP, {}, stop="tkir", cache=False).kernel_op
    args = random_args(tile_ir, {"M": 256, "N": 256, "G": 2}, 0)
    want, got = interpret_and_emulate(tile_ir, hopper, args, 0)
    np.testing.assert_allclose(got[2], want[2], rtol=2e-2, atol=2e-2)
