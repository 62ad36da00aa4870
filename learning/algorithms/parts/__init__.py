"""The pieces the algorithms are built from; none is an algorithm or is registered."""
