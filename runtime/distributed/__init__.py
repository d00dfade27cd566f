"""Tensor parallelism: rank groups, sharded layers, the step broadcast."""
