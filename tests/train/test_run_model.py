"""Issue 23: a run's model configuration is resolved once, with the data's sizes, into the environment, and
every model built from it starts from that configuration (a model that changes its own config, as NLVR2's
extra image token type does, leaves the environment's unchanged)."""
from vlkit.environment import prepare_environment
from vlkit.train import pipeline

SHAPES = {"name": "shapes", "num_images": 12, "tokenizer": "shapes", "image": {"source": "shapes"}}


def test_the_environment_holds_the_resolved_configuration(tmp_path):
    env = prepare_environment({"name": "uniter", "preset": "tiny"}, SHAPES, cache=str(tmp_path), progress=False)
    store = env.image_source.store
    assert (env.model.vocab_size, env.model.v_feature_size, env.model.v_target_size) == (
        len(env.tokenizer), store.feature_dim, store.num_classes)
    first = pipeline.build_run_model(env)
    first.extend_image_types(3)  # what an NLVR2 fine-tuning does to its model
    assert first.config.type_vocab_size == 3 and env.model.type_vocab_size == 2
    assert pipeline.build_run_model(env).config == env.model
