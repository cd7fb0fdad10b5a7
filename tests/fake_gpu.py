"""A fake of the torch.cuda calls that tkc's timing code makes, for tests without a GPU.

One in-order stream: ``now`` is when the last enqueued work ends (seconds).  Each flush
(``zero_`` of a buffer from ``empty``) and each call moves it on; events read it.  With
``tau`` set, the stream models a power-capped GPU: a call runs ``1 + k * heat`` times its
nominal time, where ``heat`` follows the power of what ran, with memory ``tau`` seconds."""

from __future__ import annotations

import math
from collections.abc import Callable
from types import SimpleNamespace


class FakeStream:
    def __init__(self, flush_s: float = 85e-6, tau: float = 0.0, k: float = 0.0, flush_power: float = 0.3) -> None:
        self.now = 0.0
        self.flush_s, self.flush_power = flush_s, flush_power
        self.tau, self.k, self.heat = tau, k, 0.0
        self.log: list[str] = []
        self.syncs = 0

    def run(self, what: str, seconds: float, power: float = 1.0) -> None:
        self.log.append(what)
        if self.tau:
            seconds *= 1 + self.k * self.heat
            self.heat += (power - self.heat) * (1 - math.exp(-seconds / self.tau))
        self.now += seconds

    def torch(self) -> SimpleNamespace:
        """A stand-in for the ``torch`` module (put it in sys.modules)."""
        stream = self

        class Event:
            def __init__(self, enable_timing: bool = False) -> None:
                self.t: float | None = None

            def record(self) -> None:
                stream.log.append("record")
                self.t = stream.now

            def synchronize(self) -> None:
                stream.syncs += 1

            def elapsed_time(self, end: Event) -> float:
                assert self.t is not None and end.t is not None
                return (end.t - self.t) * 1e3

        class Buffer:
            def __init__(self, n: int) -> None:
                self.n = n

            def zero_(self) -> None:
                stream.run("flush", stream.flush_s, stream.flush_power)

        def synchronize() -> None:
            stream.syncs += 1

        return SimpleNamespace(int8="int8", empty=lambda n, dtype=None, device=None: Buffer(n),
                               cuda=SimpleNamespace(Event=Event, synchronize=synchronize))

    def kernel(self, seconds: Callable[[float], float], power: float = 1.0, name: str = "call") -> Callable[[], None]:
        """A call whose nominal GPU time is ``seconds(start time)``."""
        return lambda: self.run(name, seconds(self.now), power)
