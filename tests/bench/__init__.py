"""Tests of the benchmarks' own machinery (the scheduling simulator and its trace)."""
