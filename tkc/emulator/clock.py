"""One clock of events for an emulated launch: when a TMA copy lands in shared memory and when
a barrier phase completes, ordered against each other.  The lost-write check reads it: a copy
may overwrite bytes that landed before the newest phase its issuer waited for (their release).

Must not: stand for time on the GPU; only the order of events counts."""

from __future__ import annotations

import itertools

#: The next event's time (increasing across every barrier and shared memory of the process).
CLOCK = itertools.count(1)
