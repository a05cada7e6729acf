"""The package's PEP 517 build backend: maturin's, with two defaults changed.

- The wheel's platform tag. Called by pip (``pip wheel``, ``pip install``), maturin
  tags a wheel ``linux_<arch>`` (it adds ``--compatibility off`` unless the build
  arguments name a compatibility): a tag that PyPI refuses and that says nothing of
  the glibc the library needs. Here a bare ``--compatibility`` is added instead,
  the default of ``maturin build``: the lowest ``manylinux_X_Y`` tag the library's
  symbol versions allow (maturin's auditwheel check): ``manylinux_2_34_x86_64`` for
  this library built on glibc 2.36, which asks for symbols of glibc 2.34. Build
  arguments that name a compatibility (``-C maturin.build-args="--compatibility
  linux"``, or ``MATURIN_PEP517_ARGS``) are left as they are.
- Finding ``maturin``. maturin's hooks run the ``maturin`` program by name; with
  ``pip install --no-build-isolation`` from an interpreter whose scripts folder is
  not on PATH (a virtual environment not activated, ``pip install --user``), it
  is not found. That folder is added to PATH when ``maturin`` is not on it.

Every other hook is maturin's own. ``backend-path`` in pyproject.toml puts this
folder on ``sys.path`` for the hooks only; it is not part of the wheel.
"""

import os
import shlex
import shutil
import sysconfig

import maturin


def _maturin_on_path():
    if shutil.which("maturin") is None:
        scripts = sysconfig.get_path("scripts")
        os.environ["PATH"] = scripts + os.pathsep + os.environ.get("PATH", "")


def _with_compatibility(config_settings):
    """``config_settings`` with ``--compatibility`` added to maturin's build
    arguments (from the settings, else ``MATURIN_PEP517_ARGS``) unless they name
    one already."""
    settings = dict(config_settings or {})
    given = settings.pop("maturin.build-args", settings.pop("build-args", None))
    if given is None:
        given = os.environ.get("MATURIN_PEP517_ARGS", "")
    args = shlex.split(given) if isinstance(given, str) else list(given)
    if not any(a.split("=", 1)[0] in ("--compatibility", "--manylinux") for a in args):
        args.append("--compatibility")
    settings["maturin.build-args"] = args
    return settings


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    _maturin_on_path()
    return maturin.build_wheel(wheel_directory, _with_compatibility(config_settings), metadata_directory)


def build_sdist(sdist_directory, config_settings=None):
    _maturin_on_path()
    return maturin.build_sdist(sdist_directory, config_settings)


def get_requires_for_build_wheel(config_settings=None):
    return maturin.get_requires_for_build_wheel(config_settings)


def get_requires_for_build_sdist(config_settings=None):
    return maturin.get_requires_for_build_sdist(config_settings)


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    _maturin_on_path()
    return maturin.prepare_metadata_for_build_wheel(metadata_directory, config_settings)


# PEP 660's editable install (`pip install -e ./python`), where maturin has it.
if hasattr(maturin, "build_editable"):

    def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
        _maturin_on_path()
        return maturin.build_editable(wheel_directory, _with_compatibility(config_settings), metadata_directory)


if hasattr(maturin, "get_requires_for_build_editable"):

    def get_requires_for_build_editable(config_settings=None):
        return maturin.get_requires_for_build_editable(config_settings)


if hasattr(maturin, "prepare_metadata_for_build_editable"):

    def prepare_metadata_for_build_editable(metadata_directory, config_settings=None):
        _maturin_on_path()
        return maturin.prepare_metadata_for_build_editable(metadata_directory, config_settings)
