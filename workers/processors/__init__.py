"""The built-in processors, one module each (``demo``, ``orders_split``, ``orders_export``, ``batch_summary``).

The registry itself is :mod:`app.core.processors`, which loads these modules by their dotted names. What a
processor author needs from it is re-exported here, beside :mod:`workers.context` and
:mod:`workers.exceptions`, so a processor module imports only from ``workers``::

    from workers.processors import processor
"""

from __future__ import annotations

from app.core.limits import rate_limit
from app.core.processors import INT64, INT64_MAX, Processor, processor

__all__ = ["INT64", "INT64_MAX", "Processor", "processor", "rate_limit"]
