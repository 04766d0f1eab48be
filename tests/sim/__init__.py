"""Tests over the deterministic cluster simulator (`raftstore.sim`)."""
