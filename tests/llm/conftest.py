"""Fixtures of the model tests; helpers live in ``llmkit``."""
