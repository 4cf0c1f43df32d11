"""The host report benchmarks print (radixlm/hostinfo.py): which code ran, as well as where."""

from __future__ import annotations

import subprocess
from pathlib import Path

import radixlm
from radixlm import hostinfo


def test_the_report_names_the_checkout_that_ran():
    """The radixlm folder this process imported and, in a git checkout, its commit: what
    tells two sides of an A/B apart (a worktree's script imports the editable install)."""
    root = Path(radixlm.__file__).resolve().parent.parent
    line = hostinfo.checkout()
    assert line.split(" @ ")[0] == str(root)
    rev = subprocess.run(["git", "-C", str(root), "rev-parse", "--short=7", "HEAD"],
                         capture_output=True, text=True).stdout.strip()
    if rev:  # (a git checkout, as CI's clone is)
        assert line.split(" @ ")[1][:7] == rev
    assert f"radixlm {line}" in hostinfo.host_line()
