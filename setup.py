"""Build hook: compiles the request path to C with mypyc, when this machine can.

Everything else about the package is in pyproject.toml. The modules listed there under
``[tool.hubproxy.compiled]`` are the ones every request and watch event runs through (tunnel
framing, the HTTP/1.1 and HTTP/2 cores, the hub's request path, the agent's exchange). mypyc
turns their type-checked Python into C extensions; the Python source stays the one truth and
runs unchanged where no extension was built. Measured side by side with `python -m bench
gateway`: about 0.6x the CPU per small request in each process (README: "The compiled request
path").

The build needs mypyc (the pinned mypy in [build-system]) and a C compiler with Python's
headers. Without them, or with ``HUBPROXY_PURE=1``, it installs the pure Python modules and says
so: the program is the same, only slower. A build is all or nothing, so a half-built set of
extensions never shadows the Python source.
"""

from __future__ import annotations

import os
import sys
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).parent
GROUP = "hubproxy_compiled"  # the one shared library the modules' extensions load
BUILD_DIR = "build"  # where mypycify writes the C files (its default), relative to this file


def compiled_modules() -> list[str]:
    with open(HERE / "pyproject.toml", "rb") as f:
        return list(tomllib.load(f)["tool"]["hubproxy"]["compiled"]["modules"])


def warn(message: str) -> None:
    print(f"hubproxy setup: {message}; installing the pure Python modules (slower, same "
          "behaviour)", file=sys.stderr)


def native_extensions() -> list:
    if os.environ.get("HUBPROXY_PURE") == "1":
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        warn("mypyc is not installed")
        return []
    paths = [str(Path(*name.split(".")).with_suffix(".py")) for name in compiled_modules()]
    try:
        # The build environment has none of the runtime libraries (aiohttp, cryptography, ...):
        # what the compiled modules take from them is typed Any here, and checked as usual by
        # tests/test_types.py, where they are installed.
        extensions = mypycify(["--ignore-missing-imports", *paths], group_name=GROUP,
                              multi_file=True, target_dir=BUILD_DIR)
    except (Exception, SystemExit) as exc:  # mypy's type errors end in SystemExit
        warn(f"mypyc could not compile the modules ({exc})")
        return []
    if not mend_bytes_slice(Path(BUILD_DIR) / "bytes_ops.c"):
        warn("mypyc's bytes slice is not the one setup.py knows how to mend")
        return []
    return extensions


def mend_bytes_slice(runtime: Path) -> bool:
    """mypyc's runtime slices bytes (``data[start:end]`` on a ``bytes``) with a negative length
    when the slice ends before it starts, and raises SystemError where Python gives b""
    (every mypy release to 2.4.1 has it). The build compiles the copy of the runtime that
    mypycify wrote into the build folder: this clamps the length there. False: the code is not
    the one expected (a mypy release that changed it), and nothing is compiled.
    tests/test_compiled.py slices bytes that way in compiled code."""
    text = runtime.read_text()
    if CLAMPED in text:
        return True
    if UNCLAMPED not in text:
        return False
    runtime.write_text(text.replace(UNCLAMPED, CLAMPED))
    return True


UNCLAMPED = "Py_ssize_t slice_len = endn - startn;"
CLAMPED = "Py_ssize_t slice_len = endn > startn ? endn - startn : 0;"


class AllOrNothing(build_ext):
    """Builds every extension, or none: on a compiler error it removes what it built. The C
    files of an extension compile in parallel, one per CPU (setuptools compiles them one by
    one, and mypyc writes one file per module)."""

    def build_extensions(self) -> None:
        compiler = self.compiler
        one_by_one = compiler.compile

        def in_parallel(sources: list[str], *args: object, **kwargs: object) -> list[str]:
            if len(sources) < 2:
                return one_by_one(sources, *args, **kwargs)
            with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
                parts = list(pool.map(lambda source: one_by_one([source], *args, **kwargs),
                                      sources))
            return [obj for part in parts for obj in part]

        compiler.compile = in_parallel
        super().build_extensions()

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # CompileError, LinkError, a missing compiler: all the same
            for output in self.get_outputs():  # in the source tree when built in place
                Path(output).unlink(missing_ok=True)
            warn(f"the C extensions did not build ({exc})")


setup(ext_modules=native_extensions(), cmdclass={"build_ext": AllOrNothing})
