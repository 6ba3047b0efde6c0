"""Children that get SIGTERM when their parent dies (Linux PR_SET_PDEATHSIG), set without
running Python between fork and exec.

Setting it with `subprocess.Popen(preexec_fn=...)` ran Python in the forked child of a process
with other threads, which Python warns is unsafe: with grpc's threads busy (the platform keeps
calls to its replicas open) the fork ran grpc's at-fork handlers in the child, which crashed
with SIGSEGV before exec (a private redis-server restarted by a test, seen in CI). Here the
child execs util-linux's `setpriv --pdeathsig TERM -- <command>`, which sets the signal and
execs the command in its place (the setting survives exec), so the signal is armed before the
command starts. A parent that dies in the first milliseconds, before `setpriv` armed it, would
send nothing: so, once armed, a `sh` checks that its parent is still the process that started
it (its pid, passed along) and exits otherwise, then execs the command in its place (the same
pid). Before that check, a parent killed right after spawning left the child running one time
in about seven (tests/platform/test_process_cleanup.py, in CI). Without `setpriv` (not Linux,
or not installed) the command runs as it is, without the signal.
"""
from __future__ import annotations

import os
import shutil
import sys

_SETPRIV = shutil.which("setpriv") if sys.platform.startswith("linux") else None
# Armed: run the command only while the parent that started it ($1) is still there.
_IF_PARENT_LIVES = 'if [ "$PPID" != "$1" ]; then exit 143; fi; shift; exec "$@"'


def dies_with_parent(command: list[str]) -> list[str]:
    """`command`, run so that the kernel sends it SIGTERM when the thread that started it
    ends (its parent's death, even by SIGKILL)."""
    if _SETPRIV is None:
        return list(command)
    return [_SETPRIV, "--pdeathsig", "TERM", "--", "/bin/sh", "-c", _IF_PARENT_LIVES, "sh",
            str(os.getpid()), *command]
