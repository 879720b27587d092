"""taskport's service, in three wings whose imports run one way (tests/unit/test_imports.py holds it):

- :mod:`app.core`: the task core that the web and the workers share (the record, states, keys, scripts, the
  stores, jobs, results, the processor registry, config, ids, clock); it imports no other wing.
- :mod:`app.web`: the Flask app, its views and everything that speaks HTTP; it imports the core.
- :mod:`app.launch`: ``taskport up``, the supervisor, the embedded server and the CLI entry; it imports the
  core, and names the web's and the workers' entry points by dotted strings resolved when they run.

The workers (the top-level ``workers`` package) import the core only.
"""
