"""The docs stay true: the README's test command is the one CI runs, the spec example in
specs/README.md is a valid spec, and the quick-start demo and the training example run."""
from __future__ import annotations

import os
import re
import subprocess
import sys

from generator.model import parse_spec
from generator.schedule import schedule
from generator.yaml_source import parse_yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def read(path: str) -> str:
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return f.read()


def bash_blocks(markdown: str) -> list[str]:
    return [block.strip() for block in re.findall(r"```bash\n(.*?)```", markdown, re.S)]


def test_ci_runs_the_readme_test_command():
    commands = [c for c in bash_blocks(read("README.md")) if "pytest" in c]
    assert len(commands) == 1, "the README should show exactly one test command"
    assert commands[0] in read(".ci/run").splitlines()


def test_spec_language_example_is_a_valid_spec():
    example = re.search(r"## A complete example\n\n```yaml\n(.*?)```", read("specs/README.md"), re.S).group(1)
    spec = parse_spec(parse_yaml(example, "specs/gelu.yaml"), "specs/gelu.yaml")
    scheduled = schedule(spec)
    assert scheduled.forward.registered_name == "gelu"
    assert [a.name for a in spec.attrs] == ["approximate"]


def test_readme_spec_example_is_the_shipped_silu_spec():
    example = re.search(r"```yaml\n# specs/silu.yaml\n(.*?)```", read("README.md"), re.S).group(1)
    shown = parse_spec(parse_yaml(example, "specs/silu.yaml"), "specs/silu.yaml")
    shipped = parse_spec(parse_yaml(read("specs/silu.yaml"), "specs/silu.yaml"), "specs/silu.yaml")
    assert [m.source for m in shown.math] == [m.source for m in shipped.math]
    assert shown.dtypes == shipped.dtypes


def run_example(*args: str) -> subprocess.CompletedProcess:
    """Run an example as a script with the avo_ops these tests import (an installed one, or
    a build in place that only the test process has on its path)."""
    import avo_ops

    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(avo_ops.__file__)))
    path = os.pathsep.join(p for p in (package_parent, os.environ.get("PYTHONPATH")) if p)
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": path})


def test_quickstart_demo_runs():
    result = run_example(os.path.join(ROOT, "examples", "quickstart.py"))
    assert result.returncode == 0, result.stderr
    assert "torch.compile(fullgraph=True)" in result.stdout


def test_training_example_runs_both_models():
    """The Llama training example, in its smoke-test size on the CPU: both runs train the
    same model (same first loss) and the avo run replaced the RMSNorm and SiLU modules."""
    result = run_example(os.path.join(ROOT, "examples", "train_llama.py"), "--tiny", "--device", "cpu",
                         "--dtype", "float32", "--steps", "1", "--warmup", "1")
    assert result.returncode == 0, result.stderr
    rows = {line.split()[0]: line.split() for line in result.stdout.splitlines()
            if line.startswith(("torch ", "avo_ops "))}
    assert rows.keys() == {"torch", "avo_ops"}
    assert abs(float(rows["torch"][3]) - float(rows["avo_ops"][3])) < 1e-4  # first loss
    assert rows["torch"][4] == "0" and rows["avo_ops"][4] == "7"  # 2 layers x 2 RMSNorm + final, 2 SiLU
