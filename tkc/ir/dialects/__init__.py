"""Op definitions, one module per dialect.  Importing this package registers them all."""

from tkc.ir.dialects import hopper, philox, tile  # noqa: F401
