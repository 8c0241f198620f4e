"""Flower strategy and ServerApp for feature-DP federated training.

:class:`FDPStrategy` wraps your model and a :class:`fedfdp.Config`; it honours
Flower's ``Strategy.start`` contract (see ``examples/fdp-app/``).
"""

from strategies.fdp_strategy import FDPStrategy

__all__ = ["FDPStrategy"]
