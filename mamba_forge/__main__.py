"""`python -m mamba_forge`: the `mamba-forge` command (pyproject.toml [project.scripts])."""

from mamba_forge.cli import entry

if __name__ == "__main__":
    entry()
