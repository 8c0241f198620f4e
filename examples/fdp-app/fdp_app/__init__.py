"""fdp-app: feature-DP added to a standard PyTorch Flower app."""
