"""Op definitions, one module per dialect.  Importing this package registers them all."""

from tkc.ir.dialects import tile  # noqa: F401
