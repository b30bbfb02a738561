"""Evaluation: TOFU-style metrics, MIA, MUSE, MMLU, statistics."""
