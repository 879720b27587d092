"""taskport's tests (a package, so helpers like ``tests.userprocs.tasks`` import from the repo root)."""
