"""Tests of the executor package: workloads, checkpoints, the worker and its protocol, inventory."""
