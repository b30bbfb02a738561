"""The content-addressed stage store and what a stage cost."""
