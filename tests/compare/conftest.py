"""The smoke comparison, run once per test session and shared by the comparison tests."""
import pytest

from vlkit.cli import main


@pytest.fixture(scope="session")
def smoke(tmp_path_factory):
    root = tmp_path_factory.mktemp("compare")
    common = ["threads=1", "progress=false", f"cache_dir={root / 'cache'}"]
    # two worker processes, then a single-process rerun: the numbers must not depend on scheduling
    assert main(["compare", "compare=smoke", f"output_dir={root / 'first'}", "workers=2", *common]) == 0
    assert main(["compare", f"manifest={root / 'first' / 'manifest.json'}", f"output_dir={root / 'rerun'}",
                 "workers=1", *common]) == 0
    return root
