"""taskport workers: the task runner, the context handed to processors and the built-in processors."""
