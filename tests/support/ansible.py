"""Running ``ansible-playbook`` and ``ansible-lint`` from the project's venv on the
repository's ansible/ directory, with Ansible's own files under a test's directory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support.procs import REPO

ANSIBLE = REPO / "ansible"
ROLE = ANSIBLE / "roles" / "ledge"
BIN = Path(sys.executable).parent


def run(
    tool: str, args: list[str], workdir: Path, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``tool`` (ansible-playbook, ansible-lint) in ansible/, the repo's ansible.cfg,
    temporary files and Ansible's home under ``workdir``; output as text, never raises
    on a failure (the tests look at it)."""
    env = dict(
        os.environ,
        ANSIBLE_CONFIG=str(ANSIBLE / "ansible.cfg"),
        ANSIBLE_HOME=str(workdir / "ansible-home"),
        ANSIBLE_LOCAL_TEMP=str(workdir / "ansible-tmp"),
        ANSIBLE_REMOTE_TEMP=str(workdir / "ansible-tmp"),
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_FORCE_COLOR="0",
        PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
    )
    try:
        return subprocess.run(
            [str(BIN / tool), *args],
            check=False,
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=ANSIBLE,
            env=env,
        )
    except subprocess.TimeoutExpired as exc:
        said = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else ""
        raise AssertionError(f"{tool} did not finish within {timeout} s:\n{said[-6000:]}") from None
