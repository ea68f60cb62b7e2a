"""MNIST classifier template: Lightning for the loop, Hydra for the configuration."""
