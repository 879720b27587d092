"""taskport workers: the task runner, the context handed to processors and the processor registry."""
