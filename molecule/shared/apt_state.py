"""What apt and dpkg say about a test host's packages: installed versions, holds, candidates, what a command
would change. Shared by the verify steps of the roles that pin and hold packages (gpu_stack, docker)."""

from __future__ import annotations


def installed_version(host, package: str) -> str:
    """The installed version of a package, or "" when it is not installed."""
    result = host.run(f"dpkg-query --show --showformat='${{Version}} ${{db:Status-Status}}' {package}")
    version, _, status = result.stdout.strip().partition(" ")
    return version if result.rc == 0 and status == "installed" else ""


def held_packages(host) -> set[str]:
    return set(host.check_output("apt-mark showhold").split())


def apt_would_change(host, args: str) -> list[str]:
    """The packages `apt-get -s <args>` would install, upgrade, downgrade or remove."""
    result = host.run(f"apt-get -s {args}")
    assert result.rc == 0, result.stdout + result.stderr
    return [line.split()[1] for line in result.stdout.splitlines() if line.startswith(("Inst ", "Remv "))]


def candidate(host, package: str, *apt_options: str) -> str:
    policy = host.check_output(f"apt-cache {' '.join(apt_options)} policy {package}")
    return next(line.split()[1] for line in policy.splitlines() if line.strip().startswith("Candidate:"))
