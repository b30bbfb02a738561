"""The report layer's types: the metric table, statistics, the typed results of the public functions and the audit
card's entries (no torch)."""
