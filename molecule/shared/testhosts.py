"""The test run's hosts as a verify step sees them: an instance's container, and the run's network.

create.yml names each container after the test run and the instance, and writes that name into molecule's
instance config as the instance's address; this module reads it there rather than repeating the rule.
"""

from __future__ import annotations

import os
from pathlib import Path

import yaml

# The run's /24 without its last byte (molecule/testrun.sh), e.g. "172.30.214".
NETWORK_PREFIX = os.environ["DDP_TEST_NET"]


def container(instance: str) -> str:
    """The docker container of a molecule instance, for docker exec, restart, stop and start."""
    instances = yaml.safe_load(Path(os.environ["MOLECULE_INSTANCE_CONFIG"]).read_text()) or []
    by_instance = {entry["instance"]: entry["address"] for entry in instances}
    return by_instance[instance]
