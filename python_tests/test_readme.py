"""Every ```python block of README.md runs as written (in a fresh subprocess, so blocks stay honest)."""

import pathlib
import re
import os
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
TEXT = (ROOT / "README.md").read_text()
# The "In a trainer" blocks need their trainer's objects: test_integration_snippets runs them.
_TRAINER = TEXT.index("## In a trainer")
_TRAINER_END = TEXT.index("\n## ", _TRAINER + 1)
BLOCKS = re.findall(r"```python\n(.*?)```", TEXT[:_TRAINER] + TEXT[_TRAINER_END:], flags=re.S)


def test_readme_has_examples():
    assert BLOCKS, "README.md lost its usage examples"


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_example_runs(index, tmp_path):
    script = tmp_path / f"readme_example_{index}.py"
    script.write_text(BLOCKS[index])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    result = subprocess.run([sys.executable, str(script)], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, f"README example {index} failed:\n{BLOCKS[index]}\n{result.stderr[-3000:]}"
