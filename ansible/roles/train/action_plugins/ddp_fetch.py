"""Action ddp_fetch: one file of a node's to the controller, checked against the digest the node reported.

    ddp_fetch: {src: REMOTE, dest: LOCAL, sha256: HEX, remove: BOOL}

ansible.builtin.fetch first asks the node for the file's checksum with a module: a Python start on the node, 0.3 s
on this machine and 4-6 s on a slow node, for a file whose digest the node runner that wrote it has just printed.
This plugin copies the file over the connection alone (sftp or scp, docker cp, a local copy), as the connecting
user, into a part file beside dest; checks its sha256; and only then renames it to dest. With remove, it deletes
src on the node by one shell command (root's copy of another user's files, collect.yml), not by a module.
"""

from __future__ import annotations

import hashlib
import shlex
from pathlib import Path
from typing import Any

from ansible.errors import AnsibleActionFail
from ansible.module_utils.parsing.convert_bool import boolean
from ansible.plugins.action import ActionBase

ARGUMENTS = {"src", "dest", "sha256", "remove"}


class ActionModule(ActionBase):
    TRANSFERS_FILES = True

    def run(self, tmp: str | None = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        args = dict(self._task.args)
        if set(args) - ARGUMENTS or not {"src", "dest", "sha256"} <= set(args):
            raise AnsibleActionFail(f"ddp_fetch takes src, dest, sha256 and remove; got {sorted(args)}")
        src, dest, expected = str(args["src"]), Path(str(args["dest"])), str(args["sha256"])
        dest.parent.mkdir(parents=True, exist_ok=True)
        part = dest.with_name(f".{dest.name}.part")
        try:
            self._connection.fetch_file(src, str(part))
            with part.open("rb") as arrived:
                got = hashlib.file_digest(arrived, "sha256").hexdigest()
            if got != expected:
                raise AnsibleActionFail(
                    f"{src} arrived from {(task_vars or {}).get('inventory_hostname', 'the node')} with sha256 "
                    f"{got}, not the {expected} the node wrote: nothing was kept"
                )
            part.replace(dest)
        finally:
            part.unlink(missing_ok=True)
        if boolean(args.get("remove", False)):
            removed = self._low_level_execute_command(f"rm -f -- {shlex.quote(src)}", sudoable=False)
            if removed["rc"] != 0:
                raise AnsibleActionFail(f"could not remove {src} on the node: {removed['stderr'].strip()}")
        return result | {"changed": True, "dest": str(dest), "sha256": got}
