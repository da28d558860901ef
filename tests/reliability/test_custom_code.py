"""Issue 54: custom code is never one keystroke away. A tokenizer (or text encoder) folder whose JSON maps a class to
a ``.py`` of its own (``auto_map``) made transformers ask "Do you wish to run the custom code? [y/N]" at 455e9a4 (vlkit
passed no ``trust_remote_code``), and ``yes |`` ran it. Now it is refused outright, without a prompt, naming the folder
and the file; every transformers load passes ``trust_remote_code=False``."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vlkit.validate import CustomCodeError, check_no_custom_code

EVIL = """import pathlib
pathlib.Path({marker!r}).write_text("the folder's code ran")
from transformers import BertTokenizerFast


class EvilTokenizer(BertTokenizerFast):
    pass
"""


@pytest.fixture
def evil_folder(tmp_path):
    """A real BERT tokenizer folder whose tokenizer_config.json maps AutoTokenizer to evil_tokenizer.py, which writes
    a marker file when imported."""
    from vlkit.data.shapes import shapes_tokenizer

    folder = tmp_path / "tok"
    shapes_tokenizer().save_pretrained(str(folder))
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["auto_map"] = {"AutoTokenizer": ["evil_tokenizer.EvilTokenizer", "evil_tokenizer.EvilTokenizer"]}
    config["tokenizer_class"] = "EvilTokenizer"
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    marker = tmp_path / "ran.txt"
    (folder / "evil_tokenizer.py").write_text(EVIL.format(marker=str(marker)))
    return folder, marker


def _load_with_yes(code: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """``yes | python -c code``: every prompt answered yes, as a script piping ``yes`` would."""
    import vlkit

    checkout = Path(vlkit.__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": f"{checkout}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "HF_HUB_OFFLINE": "1"}
    return subprocess.run(f"yes | {sys.executable} -c {code!r}", shell=True, cwd=tmp_path, capture_output=True,
                          text=True, env=env, timeout=300)


def test_a_tokenizer_folder_mapping_custom_code_is_refused_without_a_prompt(evil_folder, tmp_path):
    folder, marker = evil_folder
    done = _load_with_yes(f"from vlkit.data.tokenizers import build_tokenizer; build_tokenizer({str(folder)!r})",
                          tmp_path)
    assert done.returncode != 0
    assert not marker.exists(), "the folder's code ran"
    assert "[y/N]" not in done.stdout + done.stderr
    assert (f"CustomCodeError: data.tokenizer={folder}: tokenizer_config.json maps AutoTokenizer to custom code "
            "(evil_tokenizer.py, auto_map); vlkit never runs code from a tokenizer, config or model folder "
            "(trust_remote_code=False)") in done.stderr, done.stderr


def test_the_cli_refuses_it_in_one_paragraph(evil_folder, tmp_path):
    folder, marker = evil_folder
    done = _load_with_yes(f"import sys; from vlkit.cli import console; sys.exit(console(['pretrain', "
                          f"'data.tokenizer={folder}', 'trainer.output_dir={tmp_path / 'out'}']))", tmp_path)
    assert done.returncode == 1 and not marker.exists(), done.stderr
    assert f"data.tokenizer={folder}: tokenizer_config.json maps AutoTokenizer to custom code" in done.stderr
    assert "looks like a bug" not in done.stderr and "[y/N]" not in done.stdout + done.stderr


def test_a_text_encoder_folder_mapping_custom_code_is_refused(tmp_path):
    folder = tmp_path / "encoder"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "roberta", "auto_map": {
        "AutoModel": "someone/evil--modeling_evil.EvilModel"}}))
    from vlkit.models.encoders import build_text_encoder

    with pytest.raises(CustomCodeError, match=r"text encoder=.*encoder: config.json maps AutoModel to custom code "
                                              r"\(modeling_evil.py of the hub repository someone/evil, auto_map\)"):
        build_text_encoder("roberta", str(folder))


def test_a_standard_folder_passes(tmp_path):
    from vlkit.data.shapes import shapes_tokenizer
    from vlkit.data.tokenizers import build_tokenizer

    shapes_tokenizer().save_pretrained(str(tmp_path))
    check_no_custom_code(tmp_path, "data.tokenizer")
    assert len(build_tokenizer(str(tmp_path))) == len(shapes_tokenizer())


def test_every_transformers_load_passes_trust_remote_code_false(tmp_path, monkeypatch):
    """The tokenizer, the text encoder's weights and its config-built model: each load says trust_remote_code=False."""
    import transformers

    from vlkit.data.shapes import shapes_tokenizer
    from vlkit.data.tokenizers import build_tokenizer
    from vlkit.models.encoders import build_text_encoder

    seen = []

    def spy(cls, method):
        original = getattr(cls, method)

        def call(*args, **kwargs):
            seen.append((cls.__name__, method, kwargs.get("trust_remote_code", "unset")))
            return original(*args, **kwargs)

        monkeypatch.setattr(cls, method, call)

    for cls, method in ((transformers.AutoTokenizer, "from_pretrained"), (transformers.AutoModel, "from_pretrained"),
                        (transformers.AutoModel, "from_config")):
        spy(cls, method)
    shapes_tokenizer().save_pretrained(str(tmp_path / "tok"))
    build_tokenizer(str(tmp_path / "tok"))
    config = {"hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 32,
              "vocab_size": 50, "max_position_embeddings": 40}
    build_text_encoder("roberta", config=config).save_pretrained(str(tmp_path / "enc"))
    build_text_encoder("roberta", str(tmp_path / "enc"))
    assert seen == [("AutoTokenizer", "from_pretrained", False), ("AutoModel", "from_config", False),
                    ("AutoModel", "from_pretrained", False)]
