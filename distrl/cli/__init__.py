"""The entry points: the ``distrl`` command (:mod:`distrl.cli.main`), ``distrl train``
(:mod:`distrl.cli.train`), ``distrl eval`` (:mod:`distrl.cli.evaluate`), sweeps side by side
(:mod:`distrl.cli.sweeps`), and how a command ends on bad input (:mod:`distrl.cli.exits`)."""
