"""Signals as exceptions."""


class Terminated(KeyboardInterrupt):
    """SIGTERM (e.g. a cluster preemption): the same orderly stop as Ctrl-C, exit code 143."""
