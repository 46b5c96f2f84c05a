"""The public surface: what `import mcpipe` offers is exactly `__all__`, and every name is documented."""

import inspect

import mcpipe
import mcpipe.errors


def test_every_exported_name_exists_and_has_a_docstring():
    for name in mcpipe.__all__:
        obj = getattr(mcpipe, name)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            assert inspect.getdoc(obj), f"mcpipe.{name} has no docstring"


def test_public_names_not_in_all_are_modules_only():
    public = {n for n in dir(mcpipe) if not n.startswith("_")}
    extra = {n for n in public - set(mcpipe.__all__) if not inspect.ismodule(getattr(mcpipe, n))}
    assert extra == set()


def test_errors_share_one_base_class_and_carry_a_code():
    for name in mcpipe.errors.__all__:
        cls = getattr(mcpipe.errors, name)
        if inspect.isclass(cls) and issubclass(cls, Exception):
            assert issubclass(cls, mcpipe.MCPipeError)
            assert isinstance(cls.code, str)
