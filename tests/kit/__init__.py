"""The tests' kit: the servers, clients, tools and audit logs more than one test folder uses.

``tests`` is on ``sys.path`` (``pythonpath`` in pyproject.toml) and tests import with
``--import-mode=importlib``, so helpers live here, imported as ``kit.<module>``, never by test files'
names.
"""
