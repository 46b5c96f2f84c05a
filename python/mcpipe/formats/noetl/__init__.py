"""NoETL's playbooks (seed 004), read as they are: see ``python/mcpipe/formats/__init__.py``."""
