"""The signed records that flow between stages: typed schema, TOML/JSON I/O, signing, bundles."""
