"""margincal: margin-cliff diagnostics and Margin Calibration for relearn-robust LLM unlearning.

The library's public functions and typed results (:mod:`margincal.api`) are attributes of the package, imported on
first use (PEP 562), so ``import margincal`` stays light and torch-free until a function runs::

    import margincal

    diagnosis = margincal.diagnose("runs/mini/theta0", "runs/mini/forget10.json", ref="runs/mini/ref")
"""

__version__ = "0.1.0"

PUBLIC = (
    *("diagnose", "evaluate", "unlearn", "polish", "attack", "anchors", "audit", "population", "run_panel", "report"),
    *("mini_export", "load", "InputError"),
    *("Result", "Diagnosis", "Evaluation", "Unlearned", "Polished", "AttackResult", "AuditCard", "CheckpointCard"),
    *("PanelResult", "MiniExport"),
)  # margincal.api.__all__, named here so that importing margincal imports nothing more
# (tests/integration/test_api.py checks them equal)
__all__ = ["__version__", *PUBLIC]


def __getattr__(name: str):
    """``margincal.<name>`` for a public name of :mod:`margincal.api`, and ``margincal.api`` itself (the one import
    the package root makes, and the one upward import the layer map allows: the root is the library's face)."""
    if name in PUBLIC or name == "api":
        # the submodule itself (``from margincal import api`` would ask this hook again)
        import margincal.api as api  # lazy: torch

        return api if name == "api" else getattr(api, name)
    raise AttributeError(f"module 'margincal' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
