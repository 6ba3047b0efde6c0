"""Children that get SIGTERM when their parent dies (Linux PR_SET_PDEATHSIG), set without
running Python between fork and exec.

Setting it with `subprocess.Popen(preexec_fn=...)` ran Python in the forked child of a process
with other threads, which Python warns is unsafe: with grpc's threads busy (the platform keeps
calls to its replicas open) the fork ran grpc's at-fork handlers in the child, which crashed
with SIGSEGV before exec (a private redis-server restarted by a test, seen in CI). Here the
child execs util-linux's `setpriv --pdeathsig TERM -- <command>`, which sets the signal and
execs the command in its place (the setting survives exec), so the signal is armed before the
command starts; a parent that dies in the first milliseconds, before `setpriv` armed it, leaves
the child running (as before: stopped at exit, or by hand). Without `setpriv` (not Linux, or
not installed) the command runs as it is, without the signal.
"""
from __future__ import annotations

import shutil
import sys

_SETPRIV = shutil.which("setpriv") if sys.platform.startswith("linux") else None


def dies_with_parent(command: list[str]) -> list[str]:
    """`command`, run so that the kernel sends it SIGTERM when the thread that started it
    ends (its parent's death, even by SIGKILL)."""
    if _SETPRIV is None:
        return list(command)
    return [_SETPRIV, "--pdeathsig", "TERM", "--", *command]
