"""The README's library example runs as written."""

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def python_block(containing: str) -> str:
    """The first ```python block of the README that contains `containing`."""
    blocks = [block for block in re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
              if containing in block]
    assert blocks, f"README has no python example with {containing!r}"
    return blocks[0]


def test_readme_library_example_runs(capsys):
    namespace: dict[str, object] = {}
    exec(compile(python_block("model.germinate("), str(README), "exec"), namespace)
    slot = namespace["slot"]
    from morphogen import Stage

    assert slot.stage is Stage.BLENDING
    assert "blending" in capsys.readouterr().out.lower()


def test_readme_width_growth_example_runs(capsys):
    namespace: dict[str, object] = {}
    exec(compile(python_block('germinate("r0c0", "wider")'), str(README), "exec"), namespace)
    assert "Conv2d(1, 8" in capsys.readouterr().out  # the producer: block 0's convolution


def test_readme_branch_example_runs(capsys):
    namespace: dict[str, object] = {}
    exec(compile(python_block('germinate("3", "branch_wide")'), str(README), "exec"), namespace)
    assert "BranchSite(dims=2, in_channels=8, channels=16, stride=2)" in capsys.readouterr().out


def test_readme_residual_growth_config_builds_the_settings_it_describes():
    import textwrap

    import morphogen
    from morphogen.core.lifecycle import Criterion

    namespace: dict[str, object] = {}
    source = textwrap.dedent(python_block('"depth_blueprint": "wider_inside"'))  # the block sits indented in a list
    exec(compile(source, str(README), "exec"), namespace)
    config = morphogen.load_config(**namespace["config"])  # the tables `grow(config=...)` takes, built
    assert config == morphogen.load_config("wider_inside_blocks")  # the preset the README says holds them
    assert config.heuristic.depth_blueprint == "wider_inside"
    assert (config.heuristic.warmup_epochs, config.heuristic.first_growth_by) == (1, 0.05)
    assert config.episode.slots.gates.criterion is Criterion.LOSS
    assert config.episode.optimizer.schedule == "cosine"


def test_readme_gym_example_runs():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    gym_blocks = [block for block in blocks if "MorphogenesisEnv" in block]
    assert gym_blocks, "README has no Gymnasium example"
    namespace: dict[str, object] = {}
    exec(compile(gym_blocks[0], str(README), "exec"), namespace)
    assert namespace["env"].observation_space.contains(namespace["observation"])


def test_readme_config_examples_are_valid_run_configs():
    import tomllib

    from morphogen.commands.evaluate import EvalConfig
    from morphogen.commands.run import RunConfig
    from morphogen.config import build_config
    from morphogen.control.trainer import TrainConfig

    blocks = re.findall(r"```toml\n(.*?)```", README.read_text(), flags=re.S)
    assert len(blocks) >= 2, "README shows a run config and a [host] table"
    for block in blocks:
        text = "\n".join(line.strip() for line in block.splitlines())  # the blocks sit indented in a list
        values = tomllib.loads(text)
        # A training mix is a `morphogen train` config, a policy to play one of `morphogen eval`; every other
        # block configures `morphogen run`.
        if "policy" in values:
            evaluation = build_config(EvalConfig, values)
            assert evaluation.optimizer is not None and evaluation.optimizer.schedule == "cosine"
            continue
        config = build_config(TrainConfig if "mix" in values else RunConfig, values)
        config.with_resolved_host()
    host_example = next(block for block in blocks if "[host]" in block)
    assert "base_channels" in host_example


@pytest.mark.slow
def test_readme_own_model_example_runs(tmp_path, monkeypatch, capsys):
    import torch

    monkeypatch.chdir(tmp_path)  # the example writes runs/my-net
    namespace: dict[str, object] = {}
    exec(compile(python_block("host_from_module(net"), str(README), "exec"), namespace)
    out = capsys.readouterr().out
    assert "cnn {'stage1': 8, 'stage2': 8}" in out and "no growth" in out and "from scratch" in out
    assert "'stem': 8," in out and "'stage1': 8, 'stage1.conv': 8," in out and "'head': 10}" in out  # slot_points
    result = namespace["result"]
    assert result.run_dir == Path("runs/my-net") and (tmp_path / "runs/my-net/summary.json").exists()
    assert result.grown.final_accuracy > 80.0 and result.grown.stories  # seeds were tried
    assert out.rstrip().endswith("True")  # the exported program computes what the grown model computes
    assert (tmp_path / "runs/my-net/model.pt").exists() and (tmp_path / "runs/my-net/grown.pt2").exists()
    net, x = namespace["net"], namespace["x"]
    with torch.no_grad():  # the user's own module holds the grown host's weights
        torch.testing.assert_close(net.eval()(x), result.model.host.eval()(x), rtol=0, atol=0)

    # "Against other sizes of your model", on the example's model and data, for 2 epochs instead of 30.
    import morphogen

    grow = morphogen.grow
    monkeypatch.setattr(morphogen, "grow", lambda *args, **kwargs: grow(
        *args, **{**kwargs, "epochs": 2, "baseline": False, "from_scratch": False}))
    exec(compile(python_block("compare_with="), str(README), "exec"), namespace)
    compared = namespace["result"].fixed
    assert list(compared) == ["width 12", "width 16"]
    assert compared["width 12"].parameters < compared["width 16"].parameters
    assert "hosts to compare with, trained without growth" in capsys.readouterr().out

    # "Over several seeds": 2 seeds of 1 epoch instead of 5 of 30 (`grow` is still the 2-epoch one above).
    over_seeds = morphogen.grow_over_seeds
    monkeypatch.setattr(morphogen, "grow_over_seeds", lambda *args, **kwargs: over_seeds(
        *args, **{**kwargs, "seeds": 2, "epochs": 1, "from_scratch": False}))
    exec(compile(python_block("grow_over_seeds("), str(README), "exec"), namespace)
    assert list(namespace["result"].differences) == ["no growth", "width 12", "width 16"]
    assert "2 seeds (0, 1): mean ± std over the seeds" in capsys.readouterr().out


def test_readme_task_function_runs_from_the_command_line(tmp_path, monkeypatch, capsys):
    from morphogen.cli import main

    (tmp_path / "my_task.py").write_text(python_block("def make_task"))
    monkeypatch.chdir(tmp_path)
    assert main(["run", "--task", "my_task:make_task", "--epochs", "2", "--no-from-scratch", "--threads", "1",
                 "--compare", "width 64=my_task:wide_host", "--run-dir", "run"]) == 0
    out = capsys.readouterr().out
    assert "task sums (mlp host" in out and "width 64" in out.split("hosts to compare with", 1)[1]


def test_readme_depth_growth_example_runs(capsys):
    namespace: dict[str, object] = {}
    exec(compile(python_block("model.graft("), str(README), "exec"), namespace)
    assert capsys.readouterr().out.strip() == "{'r0c0': 'block', 'r0c1': 'block'} 56000"


@pytest.mark.slow
def test_readme_train_gym_example_runs():
    namespace: dict[str, object] = {}
    exec(compile(python_block("train_gym("), str(README), "exec"), namespace)
    result = namespace["result"]
    assert result.policy.lstm is None  # the last call: recurrent=False
    assert sum(result.returns[-20:]) / 20 > 100  # random play scores about 22


def test_readme_inside_width_example_runs(capsys):
    namespace: dict[str, object] = {}
    exec(compile(python_block('graft("2", "wider_inside")'), str(README), "exec"), namespace)
    assert "True Conv2d(8, 8" in capsys.readouterr().out


def test_readme_regression_example_grows_and_lowers_the_loss(tmp_path, monkeypatch, capsys):
    # A task with its own loss, judged by the share of the loss a seed removes: before, it grew nothing.
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {}
    exec(compile(python_block("make_friedman1"), str(README), "exec"), namespace)
    result = namespace["result"]
    assert result.model.architecture(), "no seed was kept"
    assert result.grown.final_loss < result.baseline.final_loss
    out = capsys.readouterr().out
    assert "% of loss" in out and "final val loss" in out and "negative loss" not in out


@pytest.mark.slow
def test_readme_several_inputs_example_grows_and_exports_a_program_called_as_the_model(tmp_path, monkeypatch,
                                                                                      capsys):
    import torch

    monkeypatch.chdir(tmp_path)  # the example writes runs/count-ones
    namespace: dict[str, object] = {}
    exec(compile(python_block("key_padding_mask"), str(README), "exec"), namespace)
    out = capsys.readouterr().out
    assert "no growth" in out and out.rstrip().endswith("True")  # the program computes what the model computes
    result, ids, padding = namespace["result"], namespace["ids"], namespace["padding"]
    assert result.grown.stories, "no seed was tried"
    assert result.grown.final_loss < result.baseline.final_loss  # whole blocks grown (0.74 against 0.78 here)
    assert namespace["host"].side_inputs is not None  # the blocks after the first read the mask
    program = torch.export.load(tmp_path / "runs/count-ones/grown.pt2").module()
    with torch.no_grad():  # the mask matters to the grown model
        assert not torch.allclose(program(ids[:8], padding[:8]), program(ids[:8], torch.zeros_like(padding[:8])))


def test_readme_grower_resume_example_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # it writes checkpoint.pt where it runs
    namespace: dict[str, object] = {}
    exec(compile(python_block("grower.load_state_dict("), str(README), "exec"), namespace)
    report, grower = namespace["report"], namespace["grower"]
    assert report.epoch == 8 and grower.done and (tmp_path / "checkpoint.pt").is_file()
    assert capsys.readouterr().out.startswith("8 {")


def test_readme_who_decides_example_runs_the_heuristic_the_shipped_policy_and_a_control(capsys):
    namespace: dict[str, object] = {}
    exec(compile(python_block("NoGrowthController()"), str(README), "exec"), namespace)
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line.split("  ")[0].strip() for line in lines] == ["heuristic", "policy", "no growth"]
    assert not any(line.endswith("{'1': 'dormant', '3': 'dormant'}") for line in lines[:2])  # a seed was tried
    assert lines[2].endswith("{'1': 'dormant', '3': 'dormant'}")


def test_readme_examples_import_from_morphogen_what_it_exports():
    """What a user calls is exported from `morphogen` (and resolves there); no example reaches into a submodule for
    a name `morphogen` exports."""
    import morphogen

    assert all(getattr(morphogen, name) is not None for name in morphogen.__all__)
    reached = re.findall(r"^from morphogen\.[\w.]+ import (.+)$", README.read_text(), flags=re.M)
    exported = {name.strip() for names in reached for name in names.split(",")} & set(morphogen.__all__)
    assert not exported, f"the README imports these from a submodule, not from morphogen: {sorted(exported)}"


def test_readme_unet_example_grows_across_its_skips_and_exports(tmp_path, monkeypatch, capsys):
    """"A U-Net": the example's own model, data and calls, for 3 epochs instead of 30."""
    import torch

    import morphogen

    monkeypatch.chdir(tmp_path)
    grow = morphogen.grow
    monkeypatch.setattr(morphogen, "grow", lambda *args, **kwargs: grow(*args, **{**kwargs, "epochs": 3}))
    namespace: dict[str, object] = {}
    exec(compile(python_block("carry_skips=True)"), str(README), "exec"), namespace)
    result, x = namespace["result"], namespace["x"]
    assert result.model.host.carried_values is not None  # the skips cross the slots
    assert "final val accuracy" in capsys.readouterr().out and result.grown.final_accuracy > 50.0
    program = torch.export.load(str(tmp_path / "runs/unet/grown.pt2")).module()
    with torch.no_grad():
        torch.testing.assert_close(program(x[1400:1450]), result.model.eval()(x[1400:1450]), rtol=0, atol=1e-5)


def test_readme_wider_mlps_example_widens_both_blocks_and_keeps_the_function(capsys):
    """"Wider MLPs": new hidden neurons grafted into both blocks of the built-in GPT, identity at birth."""
    namespace: dict[str, object] = {}
    exec(compile(python_block('model.graft(slot_id, "wider")'), str(README), "exec"), namespace)
    model = namespace["model"]
    assert model.architecture() == {"r0c0": "wider", "r0c1": "wider"}
    assert capsys.readouterr().out.strip().endswith("47232")  # 30,592 + 2 x (32 x 128 + 128 + 128 x 32)
