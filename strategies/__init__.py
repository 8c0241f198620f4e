"""Flower strategy and ServerApp for feature-DP federated training."""
