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
