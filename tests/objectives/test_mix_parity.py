"""Issue 45: the built-in mixes give the same losses and corruptions whichever way `Pretraining.corrupt` finds its
views. ``data/mix_losses.json`` was recorded before the views became registered entries (the if-chain of HEAD
fe3ac8b); rewrite it only on purpose: ``VLKIT_RECORD_MIX_LOSSES=1 pytest tests/objectives/test_mix_parity.py``.
Shapes and every key match exactly; the figures (float.hex) to 1e-6 relative: the float32 kernels a CPU picks (AVX2
or AVX-512) change a loss's last bit (seen as 1 ulp between two machines), while a changed mask or row moves it by
orders of magnitude more."""
import json
import os
from pathlib import Path

import pytest
import torch

from vlkit.objectives import build_pretraining
from vlkit.objectives.mix import PRESET_DIR

RECORD = Path(__file__).resolve().parent / "data" / "mix_losses.json"
PRESETS = sorted(p.stem for p in PRESET_DIR.glob("*.yaml") if p.stem != "none")


def _digest(t):
    """An exact fingerprint of a tensor: shape and the float.hex of its sum and of its sum weighted by position."""
    if t is None:
        return None
    t = t.detach().double().flatten()
    return [len(t), t.sum().item().hex(), (t * torch.arange(1, len(t) + 1, dtype=torch.float64)).sum().item().hex()]


def _figures(preset):
    """Per step: the loss and metrics of the drawn units and of every unit, and each pass's corruption."""
    torch.manual_seed(0)
    import vlkit

    model = vlkit.build_model(preset.split("_")[0], preset="tiny").eval()
    pre = build_pretraining(model, preset, seed=3)
    for objective in pre.objectives.values():
        if objective.needs_fit:  # MIM's codebook
            objective.fit(model.example_batch(batch_size=16, seed=2).pixel_values)
    batch = model.example_batch(batch_size=5, seed=1).replace(image_ids=[f"i{i}" for i in range(5)])
    out = {}
    for step in range(2):
        for label, units in (("drawn", None), ("all", pre.units)):
            result = pre(batch, step=step, units=units)
            out[f"{step}/{label}"] = {k: (v.item() if torch.is_tensor(v) else float(v)).hex()
                                      for k, v in sorted({"loss": result.loss, **result.metrics}.items())}
        g = torch.Generator().manual_seed(step)
        for views, _ in pre.plan(pre.units):
            if views == {"unimodal"}:
                continue
            corrupted, ctx = pre.corrupt(batch, views, g)
            out[f"{step}/{'+'.join(sorted(views))}"] = {
                name: _digest(value) for name, value in (
                    ("input_ids", corrupted.input_ids), ("region_feats", corrupted.region_feats),
                    ("region_masked", corrupted.region_masked), ("pixel_values", corrupted.pixel_values),
                    ("mlm_labels", ctx.mlm_labels), ("region", ctx.region_masked), ("patch", ctx.patch_masked),
                    ("itm_match", ctx.itm_match), ("score_rows", ctx.score_rows), ("text_from", ctx.text_from),
                    ("image_from", ctx.image_from))}
    return out


def _flat(figures, path=""):
    """``{path: value}`` of the nested figures, each float.hex string read as its float."""
    if isinstance(figures, (dict, list)):
        items = figures.items() if isinstance(figures, dict) else enumerate(figures)
        return {k: v for key, value in items for k, v in _flat(value, f"{path}/{key}").items()}
    return {path: float.fromhex(figures) if isinstance(figures, str) else figures}


@pytest.fixture(scope="module")
def recorded():
    if os.environ.get("VLKIT_RECORD_MIX_LOSSES"):
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            RECORD.write_text(json.dumps({p: _figures(p) for p in PRESETS}, indent=1, sort_keys=True) + "\n")
        finally:
            torch.set_num_threads(threads)
    return json.loads(RECORD.read_text())


@pytest.mark.parametrize("preset", PRESETS)
def test_builtin_mixes_give_the_recorded_losses(preset, recorded):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        got, expected = _flat(_figures(preset)), _flat(recorded[preset])
        assert got.keys() == expected.keys()
        assert {k for k, v in got.items() if v is None} == {k for k, v in expected.items() if v is None}
        numbers = [k for k, v in expected.items() if v is not None]
        assert [got[k] for k in numbers] == pytest.approx([expected[k] for k in numbers], rel=1e-6, abs=1e-12)
    finally:
        torch.set_num_threads(threads)
