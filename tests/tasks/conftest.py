"""Fixtures shared by the task tests."""
import pytest

from vlkit.data.shapes import shapes_tokenizer


@pytest.fixture(scope="module")
def tok():
    return shapes_tokenizer()
