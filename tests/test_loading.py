import re

import pytest

from cs336_systems.loading import LoadError, load_callable


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("no_colon", "--thing must look like package.module:callable, got 'no_colon'"),
        ("no_such_module_xyz:make", "cannot load --thing no_such_module_xyz:make: cannot import 'no_such_module_xyz'"),
        ("os.path:missing", "cannot load --thing os.path:missing: 'os.path' has no attribute 'missing'"),
        ("os:sep", "--thing os:sep is not callable"),
    ],
)
def test_bad_specs_are_one_line_errors(spec, message):
    with pytest.raises(LoadError) as info:
        load_callable(spec, "--thing")
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


def test_dotted_attribute_and_own_error_class():
    import os.path

    assert load_callable("os:path.join", "--thing") is os.path.join
    with pytest.raises(KeyError):
        load_callable("nope", "--thing", KeyError)


def test_a_package_that_reads_its_own_version_but_is_not_installed_says_how_to_install_it(tmp_path):
    """The handout's cs336_systems/__init__.py asks importlib.metadata for its version: a student who never
    ran `uv sync` gets PackageNotFoundError, which reads like a bug of ours without the hint."""
    from cs336_systems.loading import UserImportError, import_user_module

    module = tmp_path / "unpackaged_student.py"
    module.write_text('import importlib.metadata\n__version__ = importlib.metadata.version("no-such-dist-x9")\n')
    with pytest.raises(UserImportError) as raised:
        import_user_module("unpackaged_student", file=module)
    message = str(raised.value)
    assert "No package metadata was found for no-such-dist-x9" in message
    assert "your package no-such-dist-x9 is not installed in this Python: run `uv sync`" in message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("name", "body", "words"),
    [
        ("odd_raises", "raise RuntimeError('no ' + name)", "reading 'build': RuntimeError: no build"),
        ("odd_exits", "import sys; sys.exit(0)", "reading 'build' called sys.exit(0)"),
    ],
)
def test_a_module_getattr_that_raises_or_exits_is_one_line(tmp_path, monkeypatch, name, body, words):
    """A module-level __getattr__ of the user's runs as its names are read: it was a traceback, or exit 0."""
    from cs336_systems.adapters import AdapterError, load_adapters

    (tmp_path / f"{name}.py").write_text(f"def __getattr__(name):\n    {body}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(LoadError, match=re.escape(f"cannot load --thing {name}:build: {words}")):
        load_callable(f"{name}:build", "--thing")
    with pytest.raises(AdapterError, match=f"--adapters .*{name}.py: reading its names"):
        load_adapters(str(tmp_path / f"{name}.py"))
