"""The local services keep what they hold to this user: private data directories, no password on any
command line (every user of the machine can read those with `ps`)."""

from __future__ import annotations

from pathlib import Path

from tests.services import ROOT

VAR = ROOT / ".var"


def test_the_data_directories_are_private() -> None:
    for name in ("redis", "neo4j", "secrets"):
        mode = (VAR / name).stat().st_mode & 0o777
        assert mode & 0o077 == 0, f".var/{name} is {oct(mode)}: its queued conversations are readable by others"


def test_no_password_appears_on_a_command_line() -> None:
    secrets = [p.read_text().strip() for p in (VAR / "secrets").iterdir()]
    assert secrets, "services.sh keeps its generated passwords under .var/secrets"
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().decode(errors="replace")
        except OSError:  # the process ended meanwhile
            continue
        for secret in secrets:
            assert secret not in args, f"a password is on the command line of process {cmdline.parent.name}"
