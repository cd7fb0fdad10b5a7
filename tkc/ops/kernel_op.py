"""A tkc kernel as a PyTorch operator: ``torch.library.custom_op`` from the kernel's signature.

    op = tkc.ops.custom_op("mylib::rms_norm", rmsnorm)      # rmsnorm(x, w, y, eps, BM, BN)
    y = op(x, w, 1e-6)                                      # also torch.ops.mylib.rms_norm(x, w, 1e-6)

Owns: what each kernel parameter is to the operator, read from the kernel's tile IR as the
frontend emits it (:func:`roles`); the operator's schema; its fake implementation (the
outputs' shapes from the signature's symbolic dims, bound from the inputs, so
``torch.compile`` traces the operator without running it); and running it, on the GPU
through the kernel's launch, or in the interpreter on CPU tensors (``TKC_INTERPRET=1``
sends CUDA tensors there too, through ``tkc.kernel``).

Must not: compile or launch by itself (``tkc.kernel`` does), check launch arguments beyond
the signature (``tkc.signature.bind``; the runtime checks devices and strides), or define
gradients (the caller gives them to :func:`register_autograd`).
"""

from __future__ import annotations

import inspect
import keyword
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from tkc import signature
from tkc.errors import TkcUsageError
from tkc.ir.core import Operation
from tkc.ir.dialects import tile
from tkc.ir.types import ScalarType, TensorType
from tkc.kernel import Kernel, consts_key, interpret
from tkc.options import interpret_requested

__all__ = ["INPUT", "MISS", "MUTATED", "OUTPUT", "ZEROED", "call", "custom_op", "planned", "register_autograd",
           "roles", "without_gradient"]

#: What a kernel parameter is to its operator (see :func:`roles`).
INPUT, MUTATED, OUTPUT, ZEROED = "input", "mutated", "output", "zeroed output"


def roles(kernel: Operation) -> list[str]:
    """The role of each parameter of a ``tile.kernel`` op, in order: a tensor the kernel only
    stores to is an ``OUTPUT`` (the operator allocates it, uninitialised); one it only adds
    to atomically is a ``ZEROED`` output (allocated as zeros: an accumulator); one it reads
    and writes (or updates atomically otherwise) is ``MUTATED`` in place; anything else
    (tensors it only reads, scalars) is an ``INPUT``."""
    reads, stores, adds, updates = set(), set(), set(), set()
    for op in kernel.walk():
        if op.name in ("tile.load", "tile.gather"):
            reads.add(op.operands[0])
        elif op.name in ("tile.store", "tile.masked_store"):
            stores.add(op.operands[0])
        elif tile.is_atomic(op):
            (adds if tile.atomic_kind(op) == "add" else updates).add(op.operands[0])
    out = []
    for p in kernel.regions[0].block.args:
        touched = [p in s for s in (reads, stores, adds, updates)]
        if touched == [False, True, False, False]:
            out.append(OUTPUT)
        elif touched == [False, False, True, False]:
            out.append(ZEROED)
        elif any(touched[1:]):
            out.append(MUTATED)
        else:
            out.append(INPUT)
    return out


@dataclass(frozen=True)
class _Spec:
    """The kernel for one set of constants: every constant's value, the tensor and scalar
    parameters with their roles, and which of them (indices) are the operator's arguments
    and which its results."""

    consts: dict[str, Any]
    params: list[signature.Param]
    roles: list[str]
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    run_consts: dict[str, Any] = field(default_factory=dict)  # what the kernel is called with
    run_key: tuple = ()  # consts_key(run_consts): Kernel.call's key
    order: tuple[int, ...] = ()  # each parameter's place in (*inputs, *outputs)
    tensor_order: tuple[int, ...] | None = None  # each tensor parameter's place among those (None: in order)


class _KernelOp:
    """The implementation behind one operator: ``run`` and ``fake`` take the operator's
    arguments as torch passes them (keyword-only constants left out when at their default)."""

    def __init__(self, name: str, kernel: Kernel, consts: Mapping[str, Any], const_args: Sequence[str],
                 check: Callable[..., None] | None = None,
                 dims: Mapping[str, Callable[[dict[str, Any]], Any]] | None = None, zeroed: Sequence[str] = (),
                 accumulates: Sequence[str] = ()):
        self.name, self.kernel, self.check = name, kernel, check
        self.out_dims, self.zeroed = dict(dims or {}), frozenset(zeroed)
        self.accumulates = frozenset(accumulates)
        first = self._spec_of(dict(consts))  # defaults filled in: every constant has its value
        unknown = [n for n in const_args if n not in first.consts]
        if unknown:
            raise TkcUsageError(f"{name}: {', '.join(unknown)} is not a constant of kernel '{kernel.name}' "
                                f"(its constants: {', '.join(first.consts) or 'none'})")
        # The constants given at registration; every other one is the kernel's default for the
        # call's constants (a default may read a constant the call sets: `BM = 64 if D == 128
        # else 128`), so it is not fixed at its value for the registration's.
        self.fixed = {n: v for n, v in consts.items() if n not in const_args}
        self.const_args = {n: first.consts[n] for n in const_args}
        self.first = first = _runnable(first, {**self.fixed, **self.const_args})
        self._specs: dict[tuple, _Spec] = {consts_key(self.const_args): first}
        self._shapes: dict[tuple, list[tuple[Any, tuple[int, ...], torch.dtype]]] = {}
        # (kernel target, keyword constants, launch key of the inputs) -> how such a call runs
        self._plans: dict[tuple, _Planned] = {}
        self._last: _Planned | None = None  # the last one found, tried first (its ``match``)
        dims = {d for i in first.inputs if isinstance(t := first.params[i][1], TensorType) for d in t.dims}
        out_names = {first.params[i][0] for i in first.outputs}
        out_dims = {d for i in first.outputs for d in first.params[i][1].dims if isinstance(d, str)}
        for what, names, ok in (("zeroed", self.zeroed, out_names), ("dims", self.out_dims, out_dims - dims)):
            bad = sorted(n for n in names if n not in ok)
            if bad:
                raise TkcUsageError(f"{name}: {what}= names {', '.join(bad)}, which is not "
                                    + ("an output of the operator (its outputs: " + ", ".join(sorted(out_names))
                                       + ")" if what == "zeroed" else "a dim of an output that no input has"))
        for i in first.outputs:
            pname, t = first.params[i]
            free = [d for d in t.dims if isinstance(d, str) and d not in dims and d not in self.out_dims]
            if free:
                raise TkcUsageError(f"{name}: the output {pname}: {t} has dims ({', '.join(free)}) that no input "
                                    "tensor has, so the operator cannot size it; make it an input the kernel "
                                    "reads, fix the dims with constants, or size them with dims={...}")
        if not any(isinstance(first.params[i][1], TensorType) for i in first.inputs):
            raise TkcUsageError(f"{name}: kernel '{kernel.name}' reads no tensor: the operator takes its device "
                                "from an input tensor")

    def _spec_of(self, consts: dict[str, Any]) -> _Spec:
        op = self.kernel.lower(**consts).kernel(self.kernel.name)
        params = signature.kernel_params(op)
        rs = roles(op)
        bad = sorted(self.accumulates - {n for (n, _), r in zip(params, rs) if r == ZEROED})
        if bad:
            raise TkcUsageError(f"{self.name}: accumulates= names {', '.join(bad)}, which kernel '{self.kernel.name}' "
                                "does not only add to atomically")
        # An accumulator the caller passes (accumulates=) is an argument updated in place.
        rs = [MUTATED if r == ZEROED and n in self.accumulates else r for (n, _), r in zip(params, rs)]
        inputs = tuple(i for i, r in enumerate(rs) if r in (INPUT, MUTATED))
        outputs = tuple(i for i, r in enumerate(rs) if r in (OUTPUT, ZEROED))
        return _Spec(dict(op.attributes.get("consts") or {}), params, rs, inputs, outputs)

    def spec(self, call_consts: dict[str, Any]) -> _Spec:
        key = consts_key(call_consts)
        spec = self._specs.get(key)
        if spec is None:
            spec = self._spec_of({**self.fixed, **call_consts})
            if spec.roles != self.first.roles:
                raise TkcUsageError(f"{self.name}: with constants {call_consts} kernel '{self.kernel.name}' uses its "
                                    f"parameters differently ({spec.roles}) than with those it was registered "
                                    f"with ({self.first.roles}); register one operator per use")
            spec = self._specs[key] = _runnable(spec, {**self.fixed, **call_consts})
        return spec

    def schema(self) -> str:
        args, alias = [], iter("abcdefghijklmnopqrstuvwxyz")
        for i in self.first.inputs:
            pname, t = self.first.params[i]
            if isinstance(t, TensorType):
                args.append(f"Tensor({next(alias)}!) {pname}" if self.first.roles[i] == MUTATED else f"Tensor {pname}")
            else:
                args.append(f"{_scalar_schema(t)} {pname}")
        if self.const_args:
            args.append("*")
            args += [f"{_value_schema(v)} {n}={v!r}" for n, v in self.const_args.items()]
        outs = ["Tensor"] * len(self.first.outputs)
        returns = outs[0] if len(outs) == 1 else f"({', '.join(outs)})"
        return f"({', '.join(args)}) -> {returns}"

    def mutated(self) -> list[str]:
        return [self.first.params[i][0] for i in self.first.inputs if self.first.roles[i] == MUTATED]

    def _outputs(self, spec: _Spec, values: tuple, device: Any, fake: bool) -> list[torch.Tensor]:
        """The operator's outputs on ``device``, allocated for these inputs (checked against the
        signature the first time a set of shapes and dtypes comes)."""
        key = None
        if not fake:
            key = _shape_key(spec, values)
            shapes = self._shapes.get(key)
            if shapes is not None:
                # Sizes as separate arguments: torch parses a tuple of them a microsecond slower.
                return [alloc(*s, dtype=dt, device=device) for alloc, s, dt in shapes]
        in_params = [spec.params[i] for i in spec.inputs]
        dims = signature.bind(self.name, in_params, values, numpy_ok=False)
        for d, size in self.out_dims.items():
            try:
                dims[d] = size(dims)
            except KeyError as e:
                raise TkcUsageError(f"{self.name}: dims={{{d!r}: ...}} reads dim {e.args[0]!r}, which no input "
                                    f"has (the inputs' dims: {', '.join(sorted(map(str, dims)))})") from None
        shapes = []
        for i in spec.outputs:
            t = spec.params[i][1]
            shape = tuple(d if isinstance(d, int) else dims[d] for d in t.dims)
            zero = spec.roles[i] == ZEROED or spec.params[i][0] in self.zeroed
            shapes.append((torch.zeros if zero else torch.empty, shape, t.dtype.torch_dtype()))
        if key is not None:
            if len(self._shapes) >= 256:
                self._shapes.clear()
            self._shapes[key] = shapes
        return [alloc(*s, dtype=dt, device=device) for alloc, s, dt in shapes]

    def fake(self, *values: Any, **kwargs: Any) -> Any:
        if self.check is not None:
            self.check(*values, **kwargs)
        spec = self.spec({n: kwargs.get(n, v) for n, v in self.const_args.items()})
        return _result(self._outputs(spec, values, _one_device(self.name, values), fake=True))

    def run(self, *values: Any, **kwargs: Any) -> Any:
        if self.check is not None:
            self.check(*values, **kwargs)
        first = _first_tensor(values)
        if self._plans and first.is_cuda and not interpret_requested():
            found = self.planned(values, kwargs)
            if found is not None:
                out = _launch(found[0], found[1])
                if out is not MISS:
                    return out
        spec = self.spec({n: kwargs.get(n, v) for n, v in self.const_args.items()}) if self.const_args else self.first
        outs = self._outputs(spec, values, _one_device(self.name, values), fake=False)
        every = (*values, *outs)
        full = [every[j] for j in spec.order]
        if first.is_cuda:
            # on the GPU, or the interpreter with TKC_INTERPRET=1
            self.kernel.call(full, spec.run_consts, spec.run_key)
            self._keep_plan(spec, values, kwargs, full, first.device)
        else:
            interpret(self.kernel, *full, **spec.run_consts)
        return _result(outs)

    def planned(self, values: tuple, kwargs: dict[str, Any]) -> tuple[_Planned, list[int], bool | None] | None:
        """How an earlier call on arguments like these ran (the same tensor classes, shapes,
        strides, dtypes and devices, the same scalars and keyword constants, on this thread
        and device: they decide the outputs' shapes, the compilation and the launch's checks),
        with the tensors' addresses and whether one of them needs a gradient (None: not known
        yet); None when there was none.  One key for the whole call: the operator's outputs,
        its kernel's constants and the launch.  The last call's arguments are tried first, by
        its ``match``.  Only once a plan has been kept (a CUDA launch bound ``_runtime``)."""
        kw = tuple(kwargs.items()) if kwargs else None
        last = self._last
        if last is not None and last.key[1] == kw and last.key[0] == self.kernel.target:
            match = last.match
            addresses = match.addresses(values) if match is not None else None
            if addresses is not None:
                return last, addresses, match.grads
        addresses = []
        key = _runtime.call_key(values, addresses)[1]
        if key is None:
            return None
        entry = self._plans.get((self.kernel.target, kw, key))
        if entry is None:
            return None
        if entry is last:
            _runtime.rematch(entry, values, entry.index)
        if entry.match is not None:
            self._last = entry
        return entry, addresses, None

    def _keep_plan(self, spec: _Spec, values: tuple, kwargs: dict[str, Any], full: list, device: Any) -> None:
        """Keep how the launch on ``full`` ran, for calls on arguments like ``values`` and
        ``kwargs`` (plain tensors only: a subclass may mean something else by the same call)."""
        global _runtime
        from tkc.runtime import launch as runtime

        _runtime = runtime
        compiled = self.kernel.compiled_for(full, spec.run_key)
        plan = runtime.plan_of(compiled, full) if compiled is not None else None
        if plan is None:  # e.g. a launch with TMA off (strides TMA cannot take): not kept
            return
        shapes = self._shapes.get(_shape_key(spec, values))
        index, key = runtime.call_key(values, [])
        if key is None or shapes is None:
            return
        if not all(_PLAIN.get(type(v)) or _plain(type(v)) for v in values if isinstance(v, torch.Tensor)):
            return
        if len(self._plans) >= 256:
            self._plans.clear()
            self._last = None
        key = (self.kernel.target, tuple(kwargs.items()) if kwargs else None, key)
        self._plans[key] = _Planned(tuple(shapes), device, plan, spec.tensor_order, index, key,
                                    runtime.Match.of(values, index))


class _Planned:
    """How a call like an earlier one runs: its outputs, each (allocator, shape, dtype), on
    ``device``; the launch's plan, on torch's device ``index``; ``order``, where each of the
    plan's tensors is among the call's (inputs, then outputs), None when in that order;
    ``outs``, how many outputs there are; its ``key`` among the operator's plans; and
    ``match``, what recognises the arguments of the call that made it
    (:class:`tkc.runtime.launch.Match`; None: only the key does), made again at most a few
    times (``rematches``: :func:`tkc.runtime.launch.rematch`)."""

    __slots__ = ("outputs", "device", "plan", "order", "index", "outs", "key", "match", "rematches")

    def __init__(self, outputs: tuple, device: Any, plan: Any, order: tuple[int, ...] | None, index: int,
                 key: tuple, match: Any):
        self.outputs, self.device, self.plan, self.order, self.index = outputs, device, plan, order, index
        self.outs, self.key, self.match, self.rematches = len(outputs), key, match, 0


MISS = object()  # what a planned call returns when it has launched nothing


def _launch(entry: _Planned, addresses: list[int]) -> Any:
    """The operator's result of a call by ``entry`` on inputs at ``addresses``: its outputs
    allocated and the kernel launched on them; MISS, having launched nothing, when an address
    is not aligned (the checked way says so)."""
    device = entry.device
    if entry.outs == 1:
        alloc, shape, dtype = entry.outputs[0]
        out = alloc(*shape, dtype=dtype, device=device)  # sizes as arguments: a tuple parses slower
        addresses.append(out.data_ptr())
    else:
        outs = [alloc(*shape, dtype=dtype, device=device) for alloc, shape, dtype in entry.outputs]
        for o in outs:
            addresses.append(o.data_ptr())
        out = _result(outs)
    order = entry.order
    if not entry.plan.launch(addresses if order is None else [addresses[j] for j in order], entry.index):
        return MISS
    return out


def _shape_key(spec: _Spec, values: tuple) -> tuple:
    """What decides an operator's outputs' shapes: the inputs' shapes and dtypes."""
    key = [id(spec)]
    for v in values:  # a plain loop: this runs on every call that has no plan
        if isinstance(v, torch.Tensor):
            key += (v.shape, v.dtype)
    return tuple(key)


def _runnable(spec: _Spec, consts: dict[str, Any]) -> _Spec:
    """``spec`` with what running it needs, made once: the constants the kernel is called
    with, their key and where each parameter comes from among the inputs and outputs."""
    where = {i: n for n, i in enumerate((*spec.inputs, *spec.outputs))}
    tensors = [i for i in (*spec.inputs, *spec.outputs) if isinstance(spec.params[i][1], TensorType)]
    tensor_order = tuple(tensors.index(i) for i, (_, t) in enumerate(spec.params) if isinstance(t, TensorType))
    return replace(spec, run_consts=dict(consts), run_key=consts_key(consts),
                   order=tuple(where[i] for i in range(len(spec.params))),
                   tensor_order=None if tensor_order == tuple(range(len(tensors))) else tensor_order)


_runtime: Any = None  # tkc.runtime.launch, bound when the first plan is kept (importing tkc.ops loads no driver)


def _first_tensor(values: tuple) -> torch.Tensor:
    """The first input tensor: its device is where the outputs go and the kernel runs."""
    for v in values:
        if isinstance(v, torch.Tensor):
            return v
    raise AssertionError("an operator of a kernel has an input tensor (checked at registration)")


def _one_device(op: str, values: tuple) -> torch.device:
    """The device of the operator's input tensors, which must share one: it is where the
    outputs go and the kernel runs (a meta tensor among CPU ones would send the call to the
    fake implementation, a CPU one among CUDA ones be read by no kernel)."""
    device = _first_tensor(values).device
    for v in values:
        if isinstance(v, torch.Tensor) and v.device != device:
            raise TkcUsageError(f"{op}: its tensors must be on one device, got {device} and {v.device} (move them "
                                f"with .to({str(device)!r}))")
    return device


def _result(outs: list[torch.Tensor]) -> Any:
    if not outs:
        return None
    return outs[0] if len(outs) == 1 else tuple(outs)


def _scalar_schema(t: ScalarType) -> str:
    dt = t.dtype
    return "bool" if dt.is_bool else "int" if dt.is_int else "float"


def _value_schema(v: Any) -> str:
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int):
        return "int"
    if isinstance(v, float):
        return "float"
    raise TkcUsageError(f"a constant exposed as an operator argument must be a bool, int or float, got {v!r}")


def custom_op(name: str, kernel: Kernel, *, consts: Mapping[str, Any] | None = None,
              const_args: Sequence[str] = (), check: Callable[..., None] | None = None,
              dims: Mapping[str, Callable[[dict[str, Any]], Any]] | None = None, zeroed: Sequence[str] = (),
              accumulates: Sequence[str] = ()) -> Any:
    """Register ``kernel`` (a ``@tkc.kernel`` or ``tkc.load("file.tk", "name")``) as the PyTorch
    operator ``name`` (``"namespace::op"``, then ``torch.ops.namespace.op``) and return it
    (a ``torch.library.CustomOpDef``: call it; give it gradients with :func:`register_autograd`).

    The operator's arguments are the kernel's tensors that it reads, in order (those it
    also writes are mutated in place, ``mutates_args``), and its scalars; it returns the
    tensors the kernel only writes, allocated from the signature's dims (zeros for those
    the kernel only adds to atomically), one tensor or a tuple.  Constants are fixed:
    ``consts`` or the kernel's defaults; those named in ``const_args`` are keyword-only
    operator arguments instead (``consts``, or the kernel, gives their default).

    CUDA tensors run on the GPU (the interpreter with ``TKC_INTERPRET=1``), CPU tensors in
    the interpreter.  The fake implementation checks the inputs against the signature
    (dtypes, ranks, dims) and makes empty outputs, so ``torch.compile`` traces the operator
    without running it.  ``check``, if given, is called with the operator's arguments (as
    the operator takes them) before every call and in the fake implementation, and raises a
    ``TkcUsageError`` for what the signature allows but the kernel does not take (attention's
    query heads a multiple of the kv heads).  ``dims`` sizes an output's dims that no input
    has, each from the inputs' dims (``{"TL": lambda d: 128 * ((d["T"] + 127) // 128 + d["S1"] - 1)}``:
    varlen attention's lse, each sequence at a 128-row boundary); ``zeroed`` names outputs allocated as
    zeros, whose elements the kernel may leave unwritten (that lse's rows between sequences).
    ``accumulates`` names tensors the kernel only adds to atomically that the operator takes
    as arguments, updated in place, instead of allocating them as zeros: an accumulator another
    operator zeroed (attention's dQ, which ``attn_bwd_pre`` zeroes while it reads those rows).
    A name that is already an operator (``aten::add``,
    one of ``tkc.ops``', one registered before) is refused: torch would replace it silently.
    """
    if not isinstance(kernel, Kernel):
        raise TkcUsageError(f"tkc.ops.custom_op takes a @tkc.kernel or tkc.load(...), got {type(kernel).__name__}")
    if isinstance(const_args, str):
        raise TkcUsageError(f"{name}: const_args is a sequence of constants' names, e.g. ({const_args!r},), got the "
                            f"string {const_args!r}")
    ns, _, opname = name.partition("::")
    if not (ns.isidentifier() and opname.isidentifier()):
        raise TkcUsageError(f"an operator's name is 'namespace::name', got {name!r}")
    for p in kernel.params:
        if keyword.iskeyword(p):
            raise TkcUsageError(f"{name}: a parameter named {p!r} cannot be an operator argument")
    try:
        getattr(getattr(torch.ops, ns), opname)
    except (AttributeError, RuntimeError):
        pass  # not an operator yet
    else:
        raise TkcUsageError(f"{name} is already an operator (torch would replace it): give tkc.ops.custom_op a "
                            f"name of your own")
    impl = _KernelOp(name, kernel, dict(consts or {}), tuple(const_args), check, dims, zeroed, accumulates)
    op = torch.library.custom_op(name, impl.run, mutates_args=impl.mutated(), schema=impl.schema())
    op.register_fake(impl.fake)
    op.tkc_kernel = kernel  # what the operator runs, for readers and tests
    op.tkc_run = impl.run  # the operator's body, for call()
    op.tkc_impl = impl  # its plans, for planned()
    return op


def register_autograd(op: Any, backward: Any, setup_context: Any) -> None:
    """``op.register_autograd(backward, setup_context=setup_context)`` for an operator of
    :func:`custom_op`, and the same pair as a ``torch.autograd.Function`` that :func:`call`
    runs in eager mode: one gradient definition, two ways in.  ``setup_context(ctx, inputs,
    output[, keyword_only_inputs])`` and ``backward(ctx, *grads)`` are torch.library's."""
    op.register_autograd(backward, setup_context=setup_context)
    with_kwargs = "keyword_only_inputs" in inspect.signature(setup_context).parameters

    # The keyword-only constants travel last, as one dict, so ctx.needs_input_grad[i] is the
    # i-th operator argument's, as under the dispatcher.
    # From call(), the last is (plan, addresses, constants) instead: the launch it looked up.
    def forward(ctx: Any, *args: Any) -> Any:
        values, kwargs = args[:-1], args[-1]
        out = MISS
        if type(kwargs) is tuple:
            entry, addresses, kwargs = kwargs
            out = _launch(entry, addresses)
        if out is MISS:
            out = op.tkc_run(*values, **kwargs)
        if with_kwargs:
            setup_context(ctx, values, out, keyword_only_inputs=kwargs)
        else:
            setup_context(ctx, values, out)
        return out

    def backward_all(ctx: Any, *grads: Any) -> tuple:
        g = backward(ctx, *grads)
        return (*(g if isinstance(g, tuple) else (g,)), None)

    # Made with its name (the graph's node is "<kernel>_autogradBackward"): autograd names the
    # node's class when the Function's class is created.
    op.tkc_function = type(f"{op.tkc_kernel.name}_autograd", (torch.autograd.Function,),
                           {"forward": staticmethod(forward), "backward": staticmethod(backward_all)})
    op.tkc_apply = _apply(op.tkc_function)


def without_gradient(message: str) -> tuple[Any, Any]:
    """The backward and setup (:func:`register_autograd`'s pair) of an operator with no
    gradient of its own, a backward kernel's: differentiating through it raises
    ``TkcUsageError(message)``."""

    def backward(ctx: Any, *_: Any) -> tuple:
        raise TkcUsageError(message)

    return backward, lambda ctx, inputs, output, keyword_only_inputs=None: None


def _apply(function: Any) -> Any:
    """``function.apply`` less its Python wrapper where that has nothing to do: outside
    functorch transforms (vmap, grad ...) it unwraps dead functorch wrappers and calls the C++
    ``apply``, which is what this does, a microsecond or two sooner (``function`` has no
    ``setup_context``, so the wrapper binds no default arguments)."""
    raw = torch._C._FunctionBase.__dict__.get("apply")
    unwrap = getattr(torch._C._functorch, "unwrap_if_dead", None)
    active = getattr(torch._C, "_are_functorch_transforms_active", None)
    if raw is None or unwrap is None or active is None:  # another torch: its own way
        return function.apply
    raw = raw.__get__(None, function)
    plain = function.apply

    def apply(*args: Any) -> Any:
        if active():
            return plain(*args)
        return raw(*[unwrap(a) if isinstance(a, torch.Tensor) else a for a in args])

    return apply


def through_dispatcher() -> bool:
    """Whether an operator's call must go through torch's dispatcher: ``torch.compile`` tracing,
    a dispatch mode (fake tensors, ``opcheck``, export) or a function mode is active."""
    return torch.compiler.is_compiling() or bool(torch._C._len_torch_dispatch_stack()) \
        or torch._C._is_torch_function_mode_enabled()


def call(op: Any, *args: Any, **kwargs: Any) -> Any:
    """``op(*args, **kwargs)`` for an operator of :func:`custom_op`, past torch's dispatcher when
    it has nothing to do but run the operator: plain CUDA tensors, no ``torch.compile``
    tracing, no dispatch or function mode (fake tensors, ``opcheck``, export).  The
    dispatcher's custom-op path costs tens of microseconds of Python a call, more than the
    launch itself.  Without a gradient to record (inference, the backward passes) the kernel
    runs at once; with one, through the operator's eager ``autograd.Function``
    (:func:`register_autograd`), which records the same backward the dispatcher would.  A call
    like an earlier one (:func:`planned`) goes straight to that call's launch."""
    out = planned(op, args, kwargs)
    if out is not MISS:
        return out
    if through_dispatcher():
        return op(*args, **kwargs)
    grad = torch.is_grad_enabled()
    needs_grad = False
    for a in args:
        if isinstance(a, torch.Tensor):
            if not a.is_cuda or not (_PLAIN.get(type(a)) or _plain(type(a))):
                return op(*args, **kwargs)
            needs_grad = needs_grad or (grad and a.requires_grad)
    if needs_grad:
        apply = getattr(op, "tkc_apply", None)
        return op(*args, **kwargs) if apply is None else apply(*args, kwargs)
    return op.tkc_run(*args, **kwargs)


def planned(op: Any, args: tuple, kwargs: dict[str, Any]) -> Any:
    """:func:`call` of ``op`` on arguments like those of an earlier call that ran on the GPU
    (:meth:`_KernelOp.planned`), or MISS, having run nothing: the earlier call passed every
    check these arguments' classes, shapes, strides, dtypes, devices and scalars decide (the
    operator's, and those of a shipped operator's function, whose arguments these are when it
    would pass them on unchanged), so what is left is the global state :func:`call` looks at
    (tracing, modes, ``TKC_INTERPRET``), the gradient, and the launch's plan."""
    impl = op.tkc_impl
    if not impl._plans or interpret_requested() or through_dispatcher():
        return MISS
    found = impl.planned(args, kwargs)
    if found is None:
        return MISS
    entry, addresses, grads = found
    if torch.is_grad_enabled() and (grads or grads is None and _needs_grad(args)):
        apply = getattr(op, "tkc_apply", None)
        # the Function's forward launches by the plan found here
        return MISS if apply is None else apply(*args, (entry, addresses, kwargs))
    return _launch(entry, addresses)


def _needs_grad(args: tuple) -> bool:
    for a in args:  # a plain loop: any() over a generator costs more
        if isinstance(a, torch.Tensor) and a.requires_grad:
            return True
    return False


_PLAIN: dict[type, bool] = {torch.Tensor: True}


def _plain(cls: type) -> bool:
    """Whether tensors of class ``cls`` behave as plain tensors under torch's dispatcher:
    ``torch.Tensor``, and subclasses that override neither ``__torch_function__`` nor
    ``__torch_dispatch__`` (``torch.nn.Parameter``: a model's weights); not fake, functional or
    other wrapper tensors, which the operator must see."""
    plain = _PLAIN.get(cls)
    if plain is None:
        plain = _PLAIN[cls] = (cls.__torch_function__ is torch._C._disabled_torch_function_impl
                               and cls.__torch_dispatch__ is torch.Tensor.__torch_dispatch__)
    return plain
