"""Benchmarks: run each as a script (`python bench/<name>.py`); see each module's docstring."""
