"""Command-line interface: ``margincal <command> [--config FILE] [key=value ...]``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from margincal.config import CONFIG_DIR, apply_overrides, build, deep_merge, read_yaml

EPILOG = "Overrides use dotted keys, e.g. `seed=1 out_dir=runs/seed1 mc.kappa=2.0 attack.k=10`."


def load_demo_config(path: str | Path | None, overrides: list[str]):
    """mc.yaml (frozen MC) ← demo YAML ← key=value overrides → DemoConfig."""
    from margincal.pipeline.demo import DemoConfig

    data = {"mc": read_yaml(CONFIG_DIR / "mc.yaml")}
    data = deep_merge(data, read_yaml(path or CONFIG_DIR / "demo.yaml"))
    return build(DemoConfig, apply_overrides(data, overrides))


def _cmd_demo(args: argparse.Namespace) -> int:
    from margincal.pipeline.demo import run_demo

    cfg = load_demo_config(args.config, args.overrides)
    report = run_demo(cfg)
    print(f"\nReport: {report.resolve()}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="margincal",
        description="Relearn-robust LLM unlearning: margin-cliff diagnostics and Margin Calibration (MC).",
        epilog=EPILOG,
    )
    from margincal import __version__

    parser.add_argument("--version", action="version", version=f"margincal {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    demo = sub.add_parser(
        "demo",
        help="run the whole pipeline on the built-in mini benchmark and write a report",
        description=(
            "Build (or reuse from the cache) the mini benchmark's θ0 and θ_ref, unlearn with GradDiff and NPO, "
            "diagnose the margin cliff, polish each with MC, attack base and MC with K20-LoRA, and write "
            "results.json, cliff.png and report.md to out_dir."
        ),
        epilog=EPILOG,
    )
    demo.add_argument("--config", help=f"demo YAML (default: {CONFIG_DIR / 'demo.yaml'})")
    demo.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides")
    demo.set_defaults(func=_cmd_demo)
    return parser


def _quiet_libraries() -> None:
    """Keep the terminal for margincal's own progress: no per-file HF progress bars or absl INFO lines."""
    import logging

    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    logging.getLogger("absl").setLevel(logging.WARNING)


def main(argv: list[str] | None = None) -> int:
    _quiet_libraries()
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError, RuntimeError) as err:
        print(f"margincal {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
