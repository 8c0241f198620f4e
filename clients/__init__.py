"""Flower ClientApp for feature-DP federated training."""
