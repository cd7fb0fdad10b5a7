"""Op definitions, one module per dialect.  Importing this package registers them all."""

from tkc.ir.dialects import blackwell, hopper, philox, tile  # noqa: F401
