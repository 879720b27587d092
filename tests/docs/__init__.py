"""`make test-docs`: the pages that say their commands were run as written, run as written (tests/README.md)."""
