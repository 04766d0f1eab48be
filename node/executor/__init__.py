"""Runs job tasks in worker subprocesses: the executor loop (parent side), the worker and its
protocol, the job context, checkpoints, built-in workloads and the accelerator inventory.
"""
