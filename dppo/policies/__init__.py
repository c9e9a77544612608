"""dppo."""
