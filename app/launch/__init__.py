"""The launcher: the ``taskport`` command (``cli``), ``taskport up``'s supervisor (``supervisor``) and the
embedded Redis server (``embedded``).

It imports the core and the client package (``taskport``); the web app, the workers and the scheduler it
starts as processes, naming their entry points by dotted strings (``cli.ROLE_MAINS``, the gunicorn target).
"""
