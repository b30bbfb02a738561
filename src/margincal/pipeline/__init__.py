"""Pipelines: mini model building, the demo, and (later) panels of cells."""
