"""The optional C extension (``ppc_extproc._native``): built with the machine's C compiler by
``pip install``; without a compiler the install still succeeds and ``ppc_extproc.native`` falls
back to its pure-Python equivalents."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "ppc_extproc._native",
            sources=["src/ppc_extproc/_native.c", "src/ppc_extproc/_u64map.c"],
            depends=["src/ppc_extproc/_u64map.h"],
            extra_compile_args=["-O2"],
            optional=True,
        )
    ]
)
