"""Issue 12, config with one hop: model configs derived from the dataclasses, the family's own mix by
default, and no silent overwrite of an explicit data key by the model."""
import pytest

import vlkit
from vlkit.cli import compose
from vlkit.environment import prepare_environment
from vlkit.train import pipeline


def test_model_preset_configs_compose_with_the_familys_own_mix():
    cfg = compose("pretrain", ["model=uniter_base"])
    assert cfg.model.name == "uniter" and cfg.model.preset == "base" and cfg.get("objectives") is None
    uniter = vlkit.build_model("uniter", preset="tiny")
    assert pipeline.family_mix(uniter) == "uniter" and pipeline.family_mix(uniter, "uniter_mlm") == "uniter_mlm"
    assert compose("pretrain", ["model=meter", "objectives=meter_mim_inbatch"]).objectives.objectives.mim.kind == \
        "in_batch"


def test_a_config_group_takes_a_yaml_path(tmp_path):
    path = tmp_path / "my_mix.yaml"
    path.write_text("sampling: sum\nobjectives:\n  mlm: {weight: 2.0}\n")
    cfg = compose("pretrain", ["model=uniter", f"objectives={path}"])
    assert cfg.objectives.sampling == "sum" and cfg.objectives.objectives.mlm.weight == 2.0


SHAPES = {"name": "shapes", "num_images": 10, "tokenizer": "shapes", "image": {"source": "shapes"}}


def test_pixel_geometry_follows_the_model_and_a_conflict_is_an_error():
    env = prepare_environment({"name": "meter", "preset": "tiny"}, SHAPES, progress=False)
    assert (env.data["image"]["size"], env.data["image"]["patch_size"]) == (64, 8)
    same = {**SHAPES, "image": {"source": "shapes", "size": 64, "patch_size": 8}}
    assert prepare_environment({"name": "meter", "preset": "tiny"}, same, progress=False)
    for key, value, field, model_value in (("patch_size", 16, "patch_size", 8), ("size", 96, "image_size", 64)):
        data = {**SHAPES, "image": {"source": "shapes", key: value}}
        with pytest.raises(ValueError, match=f"data.image.{key}={value} conflicts with model.{field}={model_value}"):
            prepare_environment({"name": "meter", "preset": "tiny"}, data, progress=False)
    with pytest.raises(ValueError, match="data.image.transform"):
        prepare_environment({"name": "meter", "preset": "tiny"},
                                     {**SHAPES, "image": {"source": "shapes", "mean": [0.5] * 3}}, progress=False)
