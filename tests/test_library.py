"""Where arcpy finds libarc.so: ARC_LIBRARY first and alone, then the package, then the installed
distribution when the package is a source checkout without a build; each failure is one line."""

from pathlib import Path

import pytest

from arcpy import _lib
from arcpy.errors import NoDeviceError


@pytest.mark.parametrize("value, message", [
    ("", "ARC_LIBRARY is set but empty"),
    ("  ", "ARC_LIBRARY is set but empty"),
    ("/nonexistent/libarc.so", "ARC_LIBRARY='/nonexistent/libarc.so': no such file"),
])
def test_arc_library_set_to_nothing_usable_is_an_error_naming_it(monkeypatch, value, message):
    monkeypatch.setenv("ARC_LIBRARY", value)
    with pytest.raises(NoDeviceError) as info:
        _lib.library_path()
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


def test_arc_library_names_the_library_to_load(monkeypatch, tmp_path):
    lib = tmp_path / "libarc.so"
    lib.write_bytes(b"")
    monkeypatch.setenv("ARC_LIBRARY", str(lib))
    assert _lib.library_path() == lib


def source_checkout(tmp_path: Path) -> Path:
    package = tmp_path / "arcpy"
    package.mkdir(parents=True)
    (tmp_path / "libarc").mkdir()
    (tmp_path / "libarc" / "arc.h").write_text("/* header */")
    return package


def test_a_source_checkout_without_a_build_uses_the_installed_library(monkeypatch, tmp_path):
    monkeypatch.delenv("ARC_LIBRARY", raising=False)
    monkeypatch.setattr(_lib, "_PACKAGE", source_checkout(tmp_path / "src"))
    installed = tmp_path / "site-packages" / "arcpy" / "libarc.so"
    monkeypatch.setattr(_lib, "_installed_library", lambda: installed)
    assert _lib.library_path() == installed


def test_a_source_checkout_without_any_build_says_so_and_how_to_fix_it(monkeypatch, tmp_path):
    monkeypatch.delenv("ARC_LIBRARY", raising=False)
    monkeypatch.setattr(_lib, "_PACKAGE", source_checkout(tmp_path))
    monkeypatch.setattr(_lib, "_installed_library", lambda: None)
    with pytest.raises(NoDeviceError, match=r"imported from the source tree .*\(pip install -e \.\)"):
        _lib.library_path()


def test_the_installed_library_is_not_this_package_again(monkeypatch, tmp_path):
    # An editable install's distribution points back at this package: not a second candidate.
    monkeypatch.setattr(_lib, "_PACKAGE", Path(_lib.__file__).resolve().parent)
    found = _lib._installed_library()
    assert found is None or found.parent != _lib._PACKAGE


def test_the_installed_library_is_found_past_a_source_tree_s_own_build_metadata(monkeypatch, tmp_path):
    # Run from a source tree that `pip install .` built: its arcpy.egg-info is found first, and
    # locates a libarc.so that does not exist; the installed distribution's comes next.
    import importlib.metadata

    class Dist:
        def __init__(self, root):
            self.root = root

        def locate_file(self, name):
            return self.root / name

    installed = tmp_path / "site-packages"
    (installed / "arcpy").mkdir(parents=True)
    (installed / "arcpy" / "libarc.so").write_bytes(b"")
    monkeypatch.setattr(_lib, "_PACKAGE", source_checkout(tmp_path / "src"))
    monkeypatch.setattr(importlib.metadata, "distributions",
                        lambda name: [Dist(tmp_path / "src"), Dist(installed)])
    assert _lib._installed_library() == (installed / "arcpy" / "libarc.so").resolve()


def test_every_exception_of_errors_py_is_exported_by_the_package():
    import inspect

    import arcpy
    from arcpy import errors

    defined = {name for name, obj in vars(errors).items()
               if inspect.isclass(obj) and issubclass(obj, Exception) and obj.__module__ == errors.__name__}
    assert defined <= set(arcpy.__all__)
    assert all(getattr(arcpy, name) is getattr(errors, name) for name in defined)
