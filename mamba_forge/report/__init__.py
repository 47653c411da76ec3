"""The last stage: reports and diffs of any manifest."""
