"""The exit statuses of the `morphogen` command and of the worker processes it spawns (README: Robustness).

Torch-free, so that `cli.py`, which must start without torch, and `commands/workers.py`, which runs inside torch's
worker processes, share one definition of each. Statuses after a signal are the shell's (128 + the signal's number).
"""

from __future__ import annotations

#: A mistake of the user's or a limit of the machine: a bad setting, file or checkpoint, a busy run directory, a full
#: disk (one line).
EXIT_USER_ERROR = 2
#: Training kept diverging after every rollback and back-off (`DivergenceError`).
EXIT_DIVERGED = 3
#: A distributed rank lost the others (a rank died or hung; `PeerLostError`).
EXIT_PEER_LOST = 4
#: After Ctrl-C (SIGINT), as a shell reports a process that SIGINT ended (128 + 2).
EXIT_INTERRUPTED = 130
#: A worker whose parent died (128 + 9, as SIGKILL's): nobody reads its results any more.
EXIT_PARENT_GONE = 137
#: The reader of the output closed the pipe (`morphogen report RUN | head`), as a tool stopped by SIGPIPE reports it
#: in a shell (128 + 13).
EXIT_BROKEN_PIPE = 141
#: After SIGTERM (a job scheduler's or `kill`'s), as a shell reports a process that SIGTERM ended (128 + 15).
EXIT_TERMINATED = 143
