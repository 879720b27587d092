"""A processor module that imports everywhere but in a worker: ``taskport up`` loads it at start (its upfront
check passes), then every worker fails at its own start, again and again (tests/integration/test_launcher.py:
``up`` gives up on a process that keeps failing). A module missing everywhere is refused by ``up`` itself."""

import sys

if "worker" in sys.argv:
    raise RuntimeError("worker_import_fails: this module does not import in a worker")
