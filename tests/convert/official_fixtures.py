"""Helpers of the official-parity tests: fixture paths and metadata, the tolerance check, the fixtures'
id tokenizer (`tests/fixtures/README.md` describes the fixtures)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
ATOL = 1e-5


def fixture_path(name: str) -> Path:
    return FIXTURES / name


def meta(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.json").read_text())


def close(actual: torch.Tensor, expected: torch.Tensor, what: str, atol: float = ATOL) -> float:
    """Assert ``actual`` equals ``expected`` within ``atol`` (max abs difference); returns the difference."""
    actual, expected = torch.as_tensor(actual).float(), torch.as_tensor(expected).float()
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != official {tuple(expected.shape)}"
    diff = (actual - expected).abs().max().item() if actual.numel() else 0.0
    if os.environ.get("VLKIT_PARITY_LOG"):  # the figures README reports: VLKIT_PARITY_LOG=path pytest tests/convert
        with open(os.environ["VLKIT_PARITY_LOG"], "a") as log:
            log.write(f"{os.environ.get('PYTEST_CURRENT_TEST', '').split(' ')[0]}\t{what}\t{diff:.3g}\n")
    assert diff <= atol, f"{what}: max |vlkit - official| = {diff:.3g} > {atol}"
    return diff


class IdTokenizer:
    """The fixtures' id pass-through tokenizer: a text is space-separated ids; ``[CLS] ids [SEP]`` with the
    bert-base ids (101 / 102), truncated to ``max_length`` like the official ``tokens[:max_len - 2]``."""

    pad_token_id = 0

    def __init__(self, cls_id: int = 101, sep_id: int = 102, size: int = 128):
        self.cls_id, self.sep_id, self.size = cls_id, sep_id, size

    def __call__(self, texts, truncation: bool = True, max_length: int | None = None):
        out = []
        for text in texts:
            ids = [int(x) for x in text.split()]
            if truncation and max_length:
                ids = ids[:max_length - 2]
            out.append([self.cls_id, *ids, self.sep_id])
        return {"input_ids": out}

    def __len__(self) -> int:
        return self.size


def ids_text(ids: torch.Tensor) -> str:
    return " ".join(str(int(x)) for x in ids)
