"""Clients: programs that hand the job to a daemon, so its workers run outside the tree of the
process that started them (under slurmstepd, sshd, systemd, a container runtime). A tree whose only
endpoints are clients holds no worker to check; what each client's workers run under, and how to reach
them, in the client's own terms."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Client:
    program: str
    runs_under: str   # where its workers run
    reach: str        # how to put ncclprobe where they are


_SLURM = ("Slurm's slurmstepd on the allocated nodes",
          "run ncclprobe inside the step on each node: `srun … ncclprobe run --dir LOGS/$(hostname) -- CMD`, or "
          "`ncclprobe inspect PID` of the step's processes on a node (`scontrol listpids`)")
_CONTAINER = ("the container runtime's shim (containerd-shim, conmon), not under this client",
              "inspect the container's processes from the host: `ncclprobe inspect $(docker inspect -f "
              "'{{.State.Pid}}' CONTAINER)`, or run ncclprobe inside the container (`ncclprobe inject install` in its "
              "image, then `ncclprobe report` of its log directory)")
CLIENTS = {c.program: c for c in (
    Client("srun", *_SLURM),
    Client("sbatch", "a batch job Slurm starts later under slurmstepd",
           "put `ncclprobe run --dir LOGS/$(hostname) -- …` around the command inside the batch script (or around "
           "srun's CMD there)"),
    Client("salloc", *_SLURM),
    Client("ssh", "sshd on the remote host", "run ncclprobe on the remote host: `ssh HOST ncclprobe run -- CMD`"),
    Client("pdsh", "sshd (or rsh) on each remote host",
           "run ncclprobe on each host: `pdsh -w HOSTS ncclprobe run --dir LOGS/%h -- CMD`"),
    Client("systemd-run", "systemd (PID 1), in a transient unit",
           "`systemd-run … ncclprobe run -- CMD`, or `ncclprobe inspect` the unit's main PID "
           "(`systemctl show -p MainPID UNIT`)"),
    Client("docker", *_CONTAINER),
    Client("podman", *_CONTAINER),
    Client("nerdctl", *_CONTAINER),
    Client("kubectl", "the kubelet's container runtime on the pod's node",
           "run ncclprobe in the pod (`kubectl exec POD -- ncclprobe inspect 1`, or `kubectl debug --target`)"),
)}


def client_of(argv: list[str] | None, exe: str | None = None) -> Client | None:
    """The client a command line runs (by its program's name), or None."""
    for name in ((argv or [""])[0], exe or ""):
        base = name.rsplit("/", 1)[-1]
        if base in CLIENTS:
            return CLIENTS[base]
    return None
