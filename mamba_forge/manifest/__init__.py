"""The forge side of the signed records: TOML I/O (tomli-w), signing a qualified body, bundles and merges.

The records themselves and their codec are in mamba_forge.core; signatures are verified by mamba_forge.runtime.signing.
"""
