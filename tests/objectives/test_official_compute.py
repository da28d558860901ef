"""The papers' runs as their official code computed them (issue 53): ``score: all`` (ViLBERT's and METER's heads
decode every position) and ``share_encodings: false`` (METER's two passes each run both encoders) give the same
losses as vlkit's defaults, and more FLOPs."""
import pytest
import torch

from vlkit.flops.count import step_flops
from vlkit.models.base import build_model
from vlkit.objectives import load_mix
from vlkit.objectives.mix import build_pretraining


def _losses(family, mix):
    torch.manual_seed(0)
    model = build_model({"name": family, "preset": "tiny"})
    pretraining = build_pretraining(model, mix).eval()  # no dropout: the two ways compare exactly
    batch = model.example_batch(4, text_len=9, num_regions=6)
    with torch.no_grad():
        out = pretraining(batch, units=list(pretraining.units))
    pretraining.train()
    return out.loss, step_flops(pretraining, batch, units=list(pretraining.units))


@pytest.mark.parametrize("family, change", [
    ("vilbert", {"objectives": {"mlm": {"weight": 1.0, "score": "all"},
                                "mrc_kl": {"weight": 1.0, "reduction": "per_region", "score": "all"},
                                "itm": {"weight": 1.0, "negatives": "text", "split": "bernoulli", "neg_prob": 0.5,
                                        "match_index": 0}}}),
    ("meter", {"share_encodings": False, "objectives": {"mlm": {"weight": 1.0, "score": "all"},
                                                        "itm": {"weight": 1.0, "negatives": "image", "split": "half"}}}),
])
def test_the_official_computation_gives_the_same_loss_at_more_flops(family, change):
    default = load_mix(family)
    official = {**default, **change}
    loss, flops = _losses(family, default)
    official_loss, official_flops = _losses(family, official)
    assert official_loss.item() == pytest.approx(loss.item(), rel=1e-5)
    assert official_flops > 1.05 * flops


def test_a_misspelt_score_is_refused_naming_the_objective():
    model = build_model({"name": "uniter", "preset": "tiny"})
    with pytest.raises(ValueError, match="mlm: score must be one of masked, all"):
        build_pretraining(model, {"sampling": "sum", "objectives": {"mlm": {"score": "every"}}})
