"""Sequence state: the memory-budgeted pool and the exact prefix cache."""
