"""Example user jobs for xr, such as `examples.user_job:train` (see README.md beside this file)."""
