"""The shipped algorithms, one module each, and their helpers; plugins add more (entry points)."""
