"""The frontend: kernel source (a ``.tk`` file or a ``@tkc.kernel`` function)
to tile IR, through one grammar (``tile.lark``) and one lowering (``lower.py``)."""

from __future__ import annotations

from tkc.errors import Loc, TkcError, TkcUsageError
from tkc.ir.core import Module


def compile_source(source: str, file: str = "<string>", consts: dict[str, object] | None = None,
                   first_line: int = 1, python_function: bool = False, kernel: str | None = None) -> Module:
    """Parse and lower kernel source to a verified tile-IR module (``kernel``: that kernel
    alone, where the source has one of that name)."""
    from tkc.frontend.lower import lower_module
    from tkc.frontend.parser import parse
    from tkc.ir.verifier import verify

    tree = parse(source, file, first_line=first_line)
    module = lower_module(tree, consts, python_function=python_function, only=kernel)
    verify(module)
    return module


def compile_file(path: str, consts: dict[str, object] | None = None) -> Module:
    """Compile a ``.tk`` file; every ``@kernel`` function becomes a kernel."""
    try:
        with open(path, encoding="utf-8") as f:
            source = f.read()
    except OSError as e:
        raise TkcUsageError(f"cannot read {path}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise TkcError("file is not UTF-8 text", Loc(path, 1, 1)) from None
    return compile_source(source, path, consts)
