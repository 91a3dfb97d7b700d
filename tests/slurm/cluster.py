"""A Slurm cluster made of Debian's packages, for real ``srun`` and ``sbatch`` jobs on one machine.

One node: ``munged``, ``slurmctld`` and one ``slurmd`` on this machine, talking over loopback on
ports free at the time. Several nodes: each ``slurmd`` on a simulated host of
``tests/hosts/simhosts.py`` (its own network, hostname, IPC, mount and PID namespaces, its own
``/dev/shm``), the controller on the head node, the one ``munged`` here (its socket is a file
every namespace sees). ``srun``, ``sbatch`` and ``scancel`` run where a user would: the machine
itself (one node) or the head node (several), with ``SLURM_CONF`` pointing at this cluster.

Everything lives under one temporary folder (configuration, munge key and socket, state, spool,
logs); :meth:`SlurmCluster.close` stops each daemon by its pid (SIGTERM, then SIGKILL), removes
the folder and, with several nodes, the namespaces. Why these settings (slurm.conf below):
``proctrack/linuxproc`` and ``task/none`` need no cgroup or systemd; a node with more CPUs than
the machine has keeps back-to-back jobs from queueing; ``MpiDefault=none`` so that each test
says the PMI it uses.

Run as a program (``launch/slurm``), it starts a cluster, runs a command on its login node and
stops the cluster: ``python -m tests.slurm.cluster --nodes 2 -- srun -N 2 -n 4 hostname``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

from tests.hosts.simhosts import SimHosts, unavailable as namespaces_unavailable

ROOT = Path(__file__).resolve().parents[2]
#: the daemons and clients of Debian's slurmctld, slurmd, slurm-client and munge packages
PROGRAMS = ("munged", "slurmctld", "slurmd", "srun", "sbatch", "scancel", "sinfo")
#: CPUs each node says it has: more than the machine's, so that jobs run side by side
NODE_CPUS = 64
#: seconds a daemon or the cluster gets to come up, and to go down after SIGTERM
START_SECONDS, STOP_SECONDS = 30.0, 10.0

SLURM_CONF = """\
ClusterName=denseccl
SlurmctldHost={controller}
SlurmUser=root
SlurmdUser=root
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={base}/munge/munge.socket
StateSaveLocation={base}/state
SlurmdSpoolDir={base}/spool/%n
SlurmctldPidFile={base}/run/slurmctld.pid
SlurmdPidFile={base}/run/slurmd-%n.pid
SlurmctldLogFile={base}/log/slurmctld.log
SlurmdLogFile={base}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
SlurmdParameters=config_overrides
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SwitchType=switch/none
MailProg=/bin/true
ReturnToService=2
KillWait=2
InactiveLimit=0
TmpFS=/tmp
{nodes}
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
"""


def unavailable() -> Optional[str]:
    """Why a Slurm cluster cannot be started here, or None when it can (``launch/slurm --install``
    installs the packages where it can)."""
    missing = [program for program in PROGRAMS if shutil.which(program) is None]
    if missing:
        return (f"Slurm is not installed ({', '.join(missing)} missing): launch/slurm --install installs it "
                "with apt-get as root (slurmctld slurmd slurm-client munge libpmi2-0 libpmix-dev)")
    if os.geteuid() != 0:
        return f"a Slurm cluster of its own needs root (slurmd starts tasks as their user), not uid {os.geteuid()}"
    return None


class SlurmCluster:
    """A running cluster of ``nodes`` nodes: 1 on this machine, more on simulated hosts named
    ``h0``, ``h1``, ...; use as a context manager (or call :meth:`close`)."""

    def __init__(self, nodes: int = 1) -> None:
        self.nodes = nodes
        self.hosts: Optional[SimHosts] = None
        self.daemons: List[subprocess.Popen] = []
        self.base = Path(tempfile.mkdtemp(prefix="denseccl-slurm-", dir="/var/tmp"))
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> "SlurmCluster":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def names(self) -> List[str]:
        """The node names, in the order Slurm fills them."""
        return self.hosts.names if self.hosts is not None else [socket.gethostname()]

    # -- starting and stopping ------------------------------------------------------------------

    def _start(self) -> None:
        for folder in ("munge", "state", "spool", "run", "log"):
            (self.base / folder).mkdir(mode=0o700)
        if self.nodes > 1:
            reason = namespaces_unavailable()
            if reason is not None:
                raise RuntimeError(reason)
            self.hosts = SimHosts(self.nodes)
        self.conf = self.base / "slurm.conf"
        self.conf.write_text(self._configuration())
        self._start_munge()
        ctld = ["slurmctld", "-D", "-i", "-f", str(self.conf)]
        self.daemons.append(self._spawn(ctld, "head" if self.hosts else None))
        for name in (self.names if self.hosts else []):
            self.daemons.append(self._spawn(["slurmd", "-D", "-N", name, "-f", str(self.conf)], name))
        if self.hosts is None:
            self.daemons.append(self._spawn(["slurmd", "-D", "-f", str(self.conf)], None))
        self._wait_idle()

    def _configuration(self) -> str:
        if self.hosts is None:
            controller, ports = "localhost", _free_ports(2)
            nodes = f"NodeName={self.names[0]} NodeAddr=127.0.0.1 CPUs={NODE_CPUS} State=UNKNOWN"
        else:  # each node in its own network namespace: the default ports are free there
            controller, ports = f"head({self.hosts.head.address})", [6817, 6818]  # type: ignore[union-attr]
            nodes = "\n".join(f"NodeName={h.name} NodeAddr={h.address} CPUs={NODE_CPUS} State=UNKNOWN"
                              for h in self.hosts.hosts)
        return SLURM_CONF.format(controller=controller, ctld_port=ports[0], slurmd_port=ports[1], base=self.base,
                                 nodes=nodes)

    def _start_munge(self) -> None:
        munge = self.base / "munge"
        key = munge / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self.daemons.append(subprocess.Popen(
            ["munged", "--foreground", "--force", f"--socket={munge}/munge.socket", f"--key-file={key}",
             f"--pid-file={munge}/munged.pid", f"--log-file={self.base}/log/munged.log", f"--seed-file={munge}/seed"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        ))
        _wait_for(lambda: (munge / "munge.socket").exists(), "munged's socket", self)

    def _spawn(self, argv: Sequence[str], node: Optional[str]) -> subprocess.Popen:
        """A daemon in the foreground (``-D``), on ``node`` ("head", a host, or None: here)."""
        log = open(self.base / "log" / f"{Path(argv[0]).name}-{node or 'here'}.out", "wb")
        with log:
            return subprocess.Popen(self._on(node, argv), stdout=log, stderr=subprocess.STDOUT,
                                    env=self.environment(), start_new_session=True)

    def _wait_idle(self) -> None:
        def idle() -> bool:
            done = self.run(["sinfo", "-h", "-o", "%T %D"], timeout=10, check=False)
            states = done.stdout.split()
            return done.returncode == 0 and states[:1] == ["idle"] and states[1:2] == [str(len(self.names))]

        _wait_for(idle, "every node idle (sinfo)", self)

    def close(self) -> None:
        """Stop every daemon by its pid (the controller and each slurmd first, munged last), then
        remove the simulated hosts with whatever is left on them, and the folder."""
        for process in reversed(self.daemons):
            _stop(process)
        self.daemons = []
        if self.hosts is not None:
            self.hosts.close()
            self.hosts = None
        shutil.rmtree(self.base, ignore_errors=True)

    # -- running things -------------------------------------------------------------------------

    def environment(self, env: Optional[Dict[str, str]] = None) -> Dict[str, str]:
        """This process's environment for the cluster's commands, with ``env`` on top: the
        cluster's configuration, the checkout on ``PYTHONPATH``, the interpreter's bin first on
        ``PATH``, and no MPI launcher's or Slurm job's variables of an outer launch."""
        environment = {k: v for k, v in os.environ.items()
                       if not k.startswith(("SLURM_", "PMI_", "PMIX_", "OMPI_", "MPI_LOCAL"))}
        if self.hosts is not None:
            environment = {**environment, **{"SIMHOSTS": self.hosts.environment()["SIMHOSTS"]}}
        environment["SLURM_CONF"] = str(self.base / "slurm.conf")
        environment["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), environment.get("PYTHONPATH")]))
        environment["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), environment.get("PATH", "")])
        environment.setdefault("DENSECCL_TIMEOUT", "60")
        environment.update(env or {})
        return environment

    def _on(self, node: Optional[str], argv: Sequence[str]) -> List[str]:
        """``argv`` as a command that runs on ``node`` (None: here, the one-node cluster's login)."""
        if node is None or self.hosts is None:
            return list(argv)
        if node == "head":
            return ["nsenter", "-t", str(self.hosts.head.pid), "--net", "--uts", "--mount",  # type: ignore[union-attr]
                    f"--wd={ROOT}", *argv]
        pid = self.hosts.hosts[self.hosts.names.index(node)].pid
        return ["nsenter", "-t", str(pid), "--net", "--uts", "--ipc", "--mount", "--pid", f"--wd={ROOT}", *argv]

    def login(self, argv: Sequence[str]) -> List[str]:
        """``argv`` as a command on the login node."""
        return self._on("head" if self.hosts else None, argv)

    def run(self, argv: Sequence[str], *, timeout: float = 120, check: bool = True,
            env: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess:
        """Run ``argv`` (``srun ...``, ``sbatch ...``) on the login node; with ``check``, fail
        showing its output when it exits non-zero. On timeout its whole session is killed."""
        process = subprocess.Popen(self.login(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   env=self.environment(env), cwd=ROOT, start_new_session=True)
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            stdout, stderr = process.communicate()
            raise AssertionError(f"{' '.join(argv)} did not finish within {timeout} s\n{stdout}\n{stderr}") from None
        done = subprocess.CompletedProcess(list(argv), process.returncode, stdout, stderr)
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} exited with {done.returncode}\n--- stdout\n{stdout}\n"
                                 f"--- stderr\n{stderr}\n--- logs\n{self.logs()}")
        return done

    def shm(self, node: str) -> List[str]:
        """What is in ``node``'s ``/dev/shm`` (each simulated host has its own)."""
        done = subprocess.run(self._on(node, ["find", "/dev/shm", "-xdev", "-mindepth", "1"]),
                              capture_output=True, text=True, timeout=30)
        return done.stdout.split()

    def remove_shm(self, node: str, names: Sequence[str]) -> None:
        """Remove ``names`` (paths in ``node``'s ``/dev/shm``), as a cluster's epilog would."""
        subprocess.run(self._on(node, ["rm", "-f", "--", *names]), check=True, capture_output=True, timeout=30)

    def logs(self, tail: int = 20) -> str:
        """The last lines of every daemon's log, for a failure's message."""
        parts = []
        for path in sorted((self.base / "log").glob("*")):
            lines = path.read_text(errors="replace").splitlines()[-tail:]
            parts.append(f"== {path.name}\n" + "\n".join(lines))
        return "\n".join(parts)


def _free_ports(count: int) -> List[int]:
    """``count`` TCP ports free on loopback now (held together, so that they differ)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _wait_for(ready: Callable[[], bool], what: str, cluster: SlurmCluster) -> None:
    deadline = time.monotonic() + START_SECONDS
    while not ready():
        for process in cluster.daemons:
            if process.poll() is not None:
                raise RuntimeError(f"{process.args[0]} exited with {process.returncode}\n{cluster.logs()}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"no {what} within {START_SECONDS:g} s\n{cluster.logs()}")
        time.sleep(0.05)


def _stop(process: subprocess.Popen) -> None:
    """SIGTERM to a daemon (to the daemon itself where ``nsenter`` started it in a PID
    namespace: nsenter waits for it), SIGKILL after :data:`STOP_SECONDS`."""
    pids = [process.pid, *_children(process.pid)]
    for pid in reversed(pids):
        _signal(pid, signal.SIGTERM)
    try:
        process.wait(STOP_SECONDS)
    except subprocess.TimeoutExpired:
        for pid in pids:
            _signal(pid, signal.SIGKILL)
        process.wait(STOP_SECONDS)


def _children(pid: int) -> List[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _signal(pid: int, number: int) -> None:
    try:
        os.kill(pid, number)
    except ProcessLookupError:
        pass


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Start a cluster, run a command on its login node, stop the cluster; exit with the
    command's status."""
    parser = argparse.ArgumentParser(prog="launch/slurm", description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1, help="1: this machine; more: simulated hosts h0, h1, ...")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="what to run on the login node (after --)")
    options = parser.parse_args(argv)
    command = options.command[1:] if options.command[:1] == ["--"] else options.command
    reason = unavailable()
    if reason is not None:
        print(f"[slurm] {reason}", file=sys.stderr)
        return 2
    with SlurmCluster(options.nodes) as cluster:
        print(f"[slurm] {len(cluster.names)} node(s) idle: {','.join(cluster.names)}", file=sys.stderr)
        done = subprocess.run(cluster.login(command or ["sinfo"]), env=cluster.environment(), cwd=ROOT)
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
