"""The task core: what the web and the workers share.

The task record (``task``), its statuses and transitions (``states``), its Redis keys (``keys``) and Lua
scripts (``scripts``), one owner per Redis concern (``store`` for a task's own keys, ``indexes``,
``history``, ``stats``, ``audit``), the RQ job layer (``jobs``), the result stores (``results``,
``s3store``, ``resultbase``), the processor registry (``processors``), settings (``config``), ids,
time (``clock``), logging and process helpers. Anything may import it; it imports nothing of
:mod:`app.web`, :mod:`app.launch` or ``workers`` (tests/unit/test_imports.py).
"""
