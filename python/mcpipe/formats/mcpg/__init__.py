"""mcpg's config files (seed 003), read as they are: see ``python/mcpipe/formats/__init__.py``."""
