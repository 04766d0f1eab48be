"""Tests of jepsen-lite: histories, checkers, and the harness around them."""
