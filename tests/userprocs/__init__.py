"""A sample *user* processor package, loaded the way users load theirs.

Loaded with ``TASKPORT_PROCESSORS=tests.userprocs.tasks`` (run from the repository root).
"""
