"""Fixtures of the model tests; helpers live in ``kit.llm``."""
