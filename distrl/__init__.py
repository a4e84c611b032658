"""distrl: distributed IMPALA training (Espeholt et al. 2018) configured by Hydra."""

__version__ = "0.1.0"
