"""`python -m mamba_forge.cli`: the same as the `mamba-forge` console script."""

from mamba_forge.cli import entry

entry()
