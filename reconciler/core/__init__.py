"""The pure core: the vocabulary (model, actions) and the rules the planner and the rest share.

Nothing here does I/O or reads a clock; pyproject's import contracts hold the whole package to that."""
