"""Store keys of every shipped panel's plan, with the code version held fixed (config identity only)."""
import json, sys, traceback
from pathlib import Path
import margincal.stages as stages
stages.stage_version = lambda stage: "fixed"
import margincal.artifacts as artifacts
import margincal.mini.models as mini_models
artifacts.code_version = lambda *names: "fixed"
mini_models.code_version = lambda *names: "fixed"
try:
    import margincal.pipeline.graph as graph
except Exception:
    pass
from margincal.pipeline.panel import load_panel
from margincal.pipeline.plan import plan_panel
from margincal.config import CONFIG_DIR
out = {}
for path in sorted((CONFIG_DIR / "panels").glob("*.yaml")):
    name = path.stem
    try:
        cfg = load_panel(name, [f"store={sys.argv[2]}"])
        plans = plan_panel(cfg)
        out[name] = {p.cell.id: p.graph.keys() for p in plans}
    except Exception as err:
        out[name] = f"skipped: {type(err).__name__}: {str(err)[:200]}"
Path(sys.argv[1]).write_text(json.dumps(out, indent=1, sort_keys=True))
print({k: (len(v) if isinstance(v, dict) else v) for k, v in out.items()})
