"""margincal: margin-cliff diagnostics and Margin Calibration for relearn-robust LLM unlearning."""

__version__ = "0.1.0"
