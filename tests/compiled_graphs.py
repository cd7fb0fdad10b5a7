"""What a function's graphs call once torch.compile has traced it: the operators of its
compiled backward, for tests that a traced gradient calls tkc's operators as intended."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func


def backward_operators(f: Callable[..., torch.Tensor], *args: Any) -> list[Any]:
    """The operators (``call_function`` targets) of the backward graph of
    ``torch.compile(f, fullgraph=True)``, after running ``f(*args).backward()`` through it; the
    graphs run as traced (``aot_eager``'s way), so the gradients land in ``args``."""
    graphs: list[torch.fx.GraphModule] = []

    def keep(gm: torch.fx.GraphModule, inputs: list) -> Any:
        graphs.append(gm)
        return make_boxed_func(gm.forward)

    backend = aot_autograd(fw_compiler=lambda gm, inputs: make_boxed_func(gm.forward), bw_compiler=keep)
    torch.compile(f, fullgraph=True, backend=backend)(*args).backward()
    return [n.target for n in graphs[0].graph.nodes if n.op == "call_function"]
