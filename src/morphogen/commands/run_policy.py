"""Which learned policy plays a `morphogen run` (`--policy`, `morphogen.grow(policy=...)`), and that a resumed run
goes on with the same one.

A run records its policy in `config.json` (`policy`: "default", or the path of a run directory or checkpoint of
`morphogen train` made absolute, as the data paths are; `policy_checksum`: `policy_checksum` of what it acts with,
its width, weights and observation statistics), and so in the config text of every resume state. `run --resume`
plays the policy config.json records; given one of other weights (or a policy for a run the heuristic played, or
none for one a policy played), it refuses in one line naming both, before any file of the run is touched. A run
over seeds records them in its plan (`seeds_plan.json`) and refuses the same way.

The policy's modules are imported only when a run has a policy (`morphogen run` without one loads none of them).
"""

from __future__ import annotations

from pathlib import Path

from morphogen.control.checkpoint import CheckpointError
from morphogen.run_directory import CONFIG_FILENAME, read_json_object

#: What `--policy` names the policy shipped with morphogen by.
DEFAULT_POLICY = "default"
#: Characters of a policy's checksum that messages show.
SHOWN_CHECKSUM = 12


def recorded_policy_path(policy: str) -> str:
    """`policy` as a run records it: "default" as it is, a path made absolute (so found from any directory)."""
    return policy if policy == DEFAULT_POLICY else str(Path(policy).absolute())


def policy_identity(policy: str) -> str:
    """The checksum of what the policy `policy` names acts with (it reads the checkpoint, on the CPU)."""
    from morphogen.commands.evaluate import policy_checksum, read_policy_run

    _, state = read_policy_run(policy, "cpu")
    return policy_checksum(state)


def refuse_another_policy(run_dir: Path, policy: str | None, checksum: str | None) -> None:
    """`CheckpointError` unless the policy of checksum `checksum` (None: the heuristic) is the one that the run in
    `run_dir` recorded in its config.json."""
    recorded = read_json_object(run_dir / CONFIG_FILENAME) or {}
    check_same_policy(f"the run in {run_dir}", recorded.get("policy"), recorded.get("policy_checksum"), policy,
                      checksum)


def check_same_policy(what: str, recorded: object, recorded_checksum: object, policy: str | None,
                      checksum: str | None, advice: str | None = None) -> None:
    """`CheckpointError` naming both unless the policy of `checksum` (`policy`: its name; None: the heuristic) is the
    one `what` (a run, a run over seeds, an evaluation) recorded, by its checksum; `advice` ends the line (default:
    how to resume it with what it recorded)."""
    if recorded_checksum == checksum and (recorded is None) == (policy is None):
        return
    played = _player(recorded, recorded_checksum)
    if advice is None and recorded is None:
        advice = "resume it without --policy (grow: without policy=...)"
    elif advice is None:
        advice = (f"resume it with that policy, unchanged (--policy {recorded}, or none: `run --resume` takes it from "
                  f"{CONFIG_FILENAME}; grow: policy=...)")
    raise CheckpointError(f"{what} was played by {played}, not by {_player(policy, checksum)}; {advice}")


def _player(policy: object, checksum: object) -> str:
    """The heuristic (no policy), or the policy named with the start of its checksum."""
    if policy is None:
        return "the heuristic"
    return f"policy {policy} (weights {str(checksum)[:SHOWN_CHECKSUM]})"
