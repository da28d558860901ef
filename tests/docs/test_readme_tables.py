"""Issue 24: the README shows the claims' verdicts, whatever they are, written by ``scripts/readme_tables.py``
from a finished comparison's ``results.json`` and ``manifest.json``."""
import importlib.util
import json
import sys
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("readme_tables", REPOSITORY / "scripts" / "readme_tables.py")
tables = sys.modules.setdefault("readme_tables", importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(tables)


def _claim(name, metric, verdict, effect, p):
    rule = {"look": 1, "n": 3, "p": p, "level": 0.0167, "sign_flip_p": 0.125, "sign_flip_floor": 0.125,
            "parametric_only": verdict != "inconclusive", "state": "decided"}
    return {"claim": name, "a": "x", "b": "x/scratch", "metric": metric, "paper": "Table 2", "effect": effect,
            "ci95": 0.01, "verdict": verdict, "test": "one-sided paired t", "direction": "a > b",
            "differences": [effect] * 3, "rule": rule}


def test_verdicts_list_every_claim_with_its_counts_and_detectable_effects(tmp_path):
    claims = [_claim("pre-training helps X", "vqa", "reproduced", 0.031, 0.01),
              _claim("A beats B", "meta_sum", "contradicted", -0.2, 0.02),
              _claim("C does not help", "vqa", "inconclusive", 0.004, 1.0)]
    (tmp_path / "results.json").write_text(json.dumps({"claims": claims, "detectable_effects": {
        "vqa": {"mde": 0.031}, "meta_sum": {"mde": 0.184}, "ir_r1": {"mde": 0.05}}}))
    (tmp_path / "manifest.json").write_text(json.dumps({"seeds": [0, 1, 2], "git_commit": "0123456789abcdef",
                                                        "wall_s": 1700.0}))
    text = tables.verdicts("claims", tmp_path, 2059.4)
    assert text.startswith("`vlkit compare compare=claims` (3 seeds, 2,059 s wall, commit `0123456789ab`")
    assert "1 reproduced, 1 contradicted, 1 inconclusive. Minimum detectable effect (points): meta_sum 18.4, vqa 3.1." in text
    assert ("| pre-training helps X | x vs x/scratch | vqa | Table 2 | one-sided paired t: a > b | +3.1 ± 1.0 | "
            "+3.1 +3.1 +3.1 | look 1 (3 seeds): p 0.010 vs 0.017 | 0.125 (0.125: cannot reach the level) | "
            "**reproduced** (decided under normality) |") in text
    assert "| A beats B |" in text and "-20.0 ± 1.0 |" in text and "**contradicted** (decided under normality) |" in text
    assert "1,700 s of comparison" in tables.verdicts("claims", tmp_path, None)
    (tmp_path / "results.json").write_text(json.dumps({"claims": [], "detectable_effects": {}}))
    assert tables.verdicts("default", tmp_path, 1.0) is None  # no claims: README keeps no verdicts block


def test_the_readme_holds_the_claims_verdicts_block():
    readme = (REPOSITORY / "README.md").read_text(encoding="utf-8")
    block = readme.split("<!-- BEGIN verdicts:claims -->", 1)[1].split("<!-- END verdicts:claims -->", 1)[0]
    assert "`vlkit compare compare=claims" in block and "| claim | compared | metric |" in block
    rows = [line for line in block.splitlines() if line.startswith("| ") and "**" in line]
    from vlkit.cli import compose

    shipped = compose("compare", ["compare=claims"])["compare"]["claims"]
    assert len(rows) == len(shipped) and all(("**reproduced**" in line or "**contradicted**" in line or "**inconclusive**" in line)
                                   for line in rows)

