"""The Hopper machine model the emulator's op handlers call (DESIGN.md principle 1).

- ``smem``: shared memory as bytes (real bit patterns, real swizzle through
  ``SharedLayout``), last writer and proxy of each byte, read leases for stage races.
- ``mbarrier``: phase / arrivals / tx-count with the misuse errors.
- ``tma``: 2-D tile loads with out-of-bounds zero fill and complete_tx; stores with tails.
- ``wgmma``: one warpgroup's m64nNk instruction through real descriptors and fragments.
- ``scheduler``: roles as generators over mbarriers, seeded interleaving, deadlock reports.
- ``machine``: ``emulate`` runs a hopper-level kernel on these: CTAs in turn, one coroutine
  per warpgroup walking the ops, register tiles as ``[thread, value]`` arrays;
  ``emulate_ranks`` runs a multi-GPU kernel's CTAs of every rank at once.
- ``ranks``: the rank ops (peers' copies, flag waits, barriers across ranks) and the TMA
  stores a release has to wait for, as the lowered kernel does them on R GPUs.

No module here computes an address or a register mapping: ``tkc.ir.layouts`` does.  Every
fault is a ``tkc.errors.TkcEmulatorError``.
"""

from tkc.emulator.machine import emulate, emulate_module, emulate_ranks
from tkc.emulator.mbarrier import MBarrier, MBarrierError, PhaseError
from tkc.emulator.scheduler import DeadlockError, Wait, Yield, run
from tkc.emulator.smem import RaceError, SharedMemory, decode, encode
from tkc.emulator.tma import tma_load, tma_store
from tkc.emulator.wgmma import fragment_to_tile, tile_to_fragment, wgmma

__all__ = [
    "MBarrier", "MBarrierError", "PhaseError", "DeadlockError", "Wait", "Yield", "run",
    "RaceError", "SharedMemory", "encode", "decode", "tma_load", "tma_store",
    "fragment_to_tile", "tile_to_fragment", "wgmma", "emulate", "emulate_module", "emulate_ranks",
]
