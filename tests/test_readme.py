"""The README's library example runs as written."""

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_library_example_runs(capsys):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "README has no python example"
    namespace: dict[str, object] = {}
    exec(compile(blocks[0], str(README), "exec"), namespace)
    slot = namespace["slot"]
    from morphogen import Stage

    assert slot.stage is Stage.BLENDING
    assert "blending" in capsys.readouterr().out.lower()


def test_readme_gym_example_runs():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    gym_blocks = [block for block in blocks if "MorphogenesisEnv" in block]
    assert gym_blocks, "README has no Gymnasium example"
    namespace: dict[str, object] = {}
    exec(compile(gym_blocks[0], str(README), "exec"), namespace)
    assert namespace["env"].observation_space.contains(namespace["observation"])


def test_readme_config_examples_are_valid_run_configs():
    import tomllib

    from morphogen.commands.run import RunConfig
    from morphogen.config import build_config

    blocks = re.findall(r"```toml\n(.*?)```", README.read_text(), flags=re.S)
    assert len(blocks) >= 2, "README shows a run config and a [host] table"
    for block in blocks:
        text = "\n".join(line.strip() for line in block.splitlines())  # the blocks sit indented in a list
        config = build_config(RunConfig, tomllib.loads(text))
        config.with_resolved_host()
    host_example = next(block for block in blocks if "[host]" in block)
    assert "base_channels" in host_example
