"""Where a multi-node job meets: node count, this node's rank, the rendezvous endpoint and job id.

``hotloop train --nnodes N --node-rank R --rdzv-endpoint HOST:PORT [--rdzv-id ID]`` runs the
same line on every node; :func:`node_spec` turns those flags (or, when they are absent and
the command runs as one task per node of a Slurm step, the ``SLURM_*`` variables) into a
:class:`NodeSpec` that :func:`hotloop.parallel.launch.launch` hands to torchrun's c10d
rendezvous. Node rank 0 hosts the rendezvous store, so it must run on ``HOST``; the global
ranks of the workers follow the rendezvous, node by node.
"""
from __future__ import annotations

import os
import re
import uuid
from dataclasses import dataclass
from typing import Mapping

from .errors import LaunchError

__all__ = ["NodeSpec", "node_spec", "first_host", "DEFAULT_RDZV_PORT", "NODE_FLAGS"]

DEFAULT_RDZV_PORT = 29500
#: consumed by the launcher, not passed to the workers
NODE_FLAGS = ("--nnodes", "--node-rank", "--rdzv-endpoint", "--rdzv-id")


@dataclass(frozen=True)
class NodeSpec:
    """One node's view of the job: ``min_nodes``..``max_nodes`` nodes meet at ``endpoint``."""

    min_nodes: int
    max_nodes: int
    node_rank: int
    endpoint: str          # HOST:PORT of the rendezvous store (hosted by node rank 0)
    run_id: str            # the same on every node of one job
    source: str = "flags"  # "flags" | "slurm"

    @property
    def multi_node(self) -> bool:
        return self.max_nodes > 1

    @property
    def nnodes_arg(self) -> str:
        """torchrun's ``--nnodes`` value (``N`` or ``MIN:MAX``)."""
        return str(self.max_nodes) if self.min_nodes == self.max_nodes else f"{self.min_nodes}:{self.max_nodes}"

    @property
    def host(self) -> str:
        return self.endpoint.rsplit(":", 1)[0]

    @property
    def loopback(self) -> bool:
        return self.host in ("127.0.0.1", "localhost", "::1")


def _nnodes(text: str) -> tuple[int, int]:
    match = re.fullmatch(r"(\d+)(?::(\d+))?", text.strip())
    if not match:
        raise LaunchError(f"--nnodes expects N or MIN:MAX (integers), got {text!r}")
    low = int(match.group(1))
    high = int(match.group(2) or low)
    if not 1 <= low <= high:
        raise LaunchError(f"--nnodes {text!r}: need 1 <= MIN <= MAX")
    return low, high


def _endpoint(text: str) -> str:
    host, sep, port = text.strip().rpartition(":")
    if not sep:
        host, port = text.strip(), str(DEFAULT_RDZV_PORT)
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise LaunchError(f"--rdzv-endpoint expects HOST:PORT, got {text!r}")
    return f"{host}:{int(port)}"


def first_host(nodelist: str) -> str:
    """The first host name of a Slurm node list (``node[03-05,9],gpu1`` -> ``node03``)."""
    text = nodelist.strip()
    match = re.match(r"([^,\[]+)(?:\[([^\]]+)\])?", text)
    if not match:
        raise LaunchError(f"cannot read the Slurm node list {nodelist!r}")
    prefix, ranges = match.group(1), match.group(2)
    if not ranges:
        return prefix
    return prefix + ranges.split(",")[0].split("-")[0]


def _int(value: str | None, flag: str) -> int | None:
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise LaunchError(f"{flag} expects an integer, got {value!r}") from None


def _from_slurm(environ: Mapping[str, str]) -> dict[str, str] | None:
    """The node flags a Slurm step implies (one ``hotloop`` task per node), or None outside one."""
    nodes = environ.get("SLURM_STEP_NUM_NODES") or environ.get("SLURM_NNODES")
    if "SLURM_STEP_ID" not in environ or not nodes or not nodes.isdigit() or int(nodes) < 2:
        return None
    tasks = environ.get("SLURM_STEP_NUM_TASKS", nodes)
    if tasks != nodes:
        raise LaunchError(f"the Slurm step runs {tasks} tasks on {nodes} nodes; run one hotloop task per "
                          "node (srun --ntasks-per-node 1) and set --nproc to the processes per node")
    nodelist = environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST", "")
    host = environ.get("MASTER_ADDR") or (first_host(nodelist) if nodelist else "")
    if not host:
        raise LaunchError("a Slurm step without SLURM_STEP_NODELIST: pass --rdzv-endpoint HOST:PORT")
    port = environ.get("MASTER_PORT", str(DEFAULT_RDZV_PORT))
    return {"--nnodes": nodes, "--node-rank": environ.get("SLURM_NODEID", "0"),
            "--rdzv-endpoint": f"{host}:{port}",
            "--rdzv-id": f"slurm-{environ.get('SLURM_JOB_ID', 'job')}-{environ['SLURM_STEP_ID']}"}


def node_spec(flags: Mapping[str, str | None], environ: Mapping[str, str] | None = None) -> NodeSpec | None:
    """The job's :class:`NodeSpec` from the node flags (``{"--nnodes": "2", ...}``), else Slurm's.

    None for a one-node job (no flags, no multi-node Slurm step). Flags given win over Slurm.
    """
    environ = os.environ if environ is None else environ
    given = {k: v for k, v in flags.items() if v is not None}
    slurm = _from_slurm(environ) if not given.get("--nnodes") else None
    values = {**(slurm or {}), **given}
    if "--nnodes" not in values:
        if given:
            raise LaunchError(f"{', '.join(sorted(given))} need --nnodes")
        return None
    low, high = _nnodes(values["--nnodes"])
    if high == 1:
        return None
    if "--rdzv-endpoint" not in values:
        raise LaunchError("--nnodes > 1 needs --rdzv-endpoint HOST:PORT (node rank 0's address)")
    rank = _int(values.get("--node-rank"), "--node-rank")
    if rank is None:
        raise LaunchError("--nnodes > 1 needs --node-rank R (0 on the node at --rdzv-endpoint)")
    if not 0 <= rank < high:
        raise LaunchError(f"--node-rank {rank} is not in [0, {high})")
    run_id = values.get("--rdzv-id") or ""
    if not run_id:
        raise LaunchError("--nnodes > 1 needs --rdzv-id ID, the same on every node of the job "
                          f"(for example {uuid.uuid4().hex[:8]})")
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", run_id):
        raise LaunchError(f"--rdzv-id {run_id!r}: use letters, digits, '.', '_' and '-'")
    return NodeSpec(low, high, rank, _endpoint(values["--rdzv-endpoint"]), run_id,
                    "slurm" if slurm and not given else "flags")
