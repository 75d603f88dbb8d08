"""schedctl: the command-line interface."""
