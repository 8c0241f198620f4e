"""Flower ClientApp for feature-DP federated training.

For your own ClientApp, two handlers (see ``examples/fdp-app/``):
:func:`fdp_query` answers the strategy's registration query,
:func:`fdp_train` answers a train instruction with your model and data.
"""

from clients.client_app import fdp_query, fdp_train

__all__ = ["fdp_query", "fdp_train"]
