"""The shipped algorithms, one module each (agent side, coordinator side, privacy events), and
their helpers; plugins register more through the ``dpfl.algorithms`` entry point."""
