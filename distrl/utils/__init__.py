"""Utilities that know nothing of RL: checkpoint files (:mod:`distrl.utils.checkpoint`), the run
lock (:mod:`distrl.utils.runlock`), metrics sinks (:mod:`distrl.utils.telemetry`), signals as
exceptions (:mod:`distrl.utils.signals`)."""
