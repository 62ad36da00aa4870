"""The contract, the family bases and one module per algorithm; their pieces: ``parts``."""
