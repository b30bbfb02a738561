"""Panels: panel files and their validation, the plan of a cell (its stage graph as data), the run of a plan's
nodes through the store, and the local and Ray executors."""
