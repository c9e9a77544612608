"""Verifiable synthetic tasks for ``env=prompts``: prompt generators and programmatic rewards."""
