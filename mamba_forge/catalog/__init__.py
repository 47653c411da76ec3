"""Stage 1, the catalog: the declarative kernel catalog (schema, expressions, targets)."""
