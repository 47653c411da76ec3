"""The bottom layer: standard library only, imported by the runtime and the forge alike and importing neither.

The manifest records (``schema``) and their one codec (``codec``), the bounded expression language (``expr``), the
shared words (``vocab``: dtype tokens, GEMM layouts, ``ComputeCapability``, ``DeviceInfo``), the cache store
(``cache``) and the parsed-TOML memo kept in it (``tomlmemo``), the rules for hostile paths and bounded reads
(``safety``), the one atomic write (``fsio``), the error classes (``errors``) and where the package data is
(``resources``). tests/test_layers.py holds every layer to it.
"""
