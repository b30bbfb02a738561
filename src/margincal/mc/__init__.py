"""Margin Calibration (paper Sec. 3.4): its loss terms, the polish, and the theory instruments."""
