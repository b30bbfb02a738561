"""The built-in mini benchmark: generated fictitious authors (data), its models (store stages) and its family."""
