"""Qualification on a live GPU: spec (catalog launch spec -> concrete launch), checks (admission, correctness,
determinism under perturbation), worker (the isolated subprocess), runner (parent: isolation, devices, manifest)."""
