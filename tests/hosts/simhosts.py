"""Simulated hosts: MPI jobs across several "machines" made of Linux namespaces.

Each host is a process tree in its own network, UTS (hostname), IPC, mount and PID namespaces,
with a private tmpfs on ``/dev/shm`` and ``/tmp``: MPICH and Open MPI see one node per host
(``Split_type(COMM_TYPE_SHARED)``) and talk TCP between hosts. A "head" node (the login node
where ``mpiexec`` runs) has its own network and UTS namespaces. Every node has one veth into a
bridge that lives in a "switch" network namespace; nothing is connected to the machine's own
network, so no packet can leave the namespaces made here. The launchers reach the hosts through
``tests/hosts/rsh``, an ssh stand-in that enters a host's namespaces.

Teardown is structural: the init process of every namespace reads its stdin, a pipe from this
process, and exits at end of file. When it exits, the kernel kills every process left in its PID
namespace and frees the network namespace with its veth and addresses. So closing the pipes
(``close()``, an ``atexit`` hook, or this process dying, even by SIGKILL) removes everything.

Needs root (or CAP_SYS_ADMIN + CAP_NET_ADMIN), ``unshare``, ``nsenter`` and ``ip``;
:func:`unavailable` says why not when they are missing.
"""

from __future__ import annotations

import atexit
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from denseccl.config import MPI_LAUNCH_VARIABLES
from tests.support import ranks

ROOT = Path(__file__).resolve().parents[2]
RSH = Path(__file__).with_name("rsh")
#: TEST-NET-1 (RFC 5737): reserved for documentation, so it can never name a real peer
SUBNET = "192.0.2.{}"
HEAD_ADDRESS = SUBNET.format(254)
#: a host's own namespaces: network, hostname, System V IPC, mounts, process ids
HOST_NAMESPACES = ("--net", "--uts", "--ipc", "--mount", "--pid")
#: where the hosts' shared directories go (/tmp is private to each host)
SHARED_PARENT, SHARED_PREFIX = "/var/tmp", "denseccl-simhosts-"


def unavailable() -> Optional[str]:
    """Why simulated hosts cannot be made here, or None when they can."""
    for tool in ("unshare", "nsenter", "ip"):
        if shutil.which(tool) is None:
            return f"simulated hosts need '{tool}' (util-linux / iproute2), which is not installed"
    probe = subprocess.run(
        ["unshare", "--net", "--uts", "--ipc", "--mount", "--pid", "--fork", "--mount-proc", "--propagation", "private",
         "sh", "-c", "ip link add simhost-probe type bridge && mount -t tmpfs probe /tmp"],
        capture_output=True, text=True, timeout=30,
    )
    if probe.returncode != 0:
        return (f"namespaces are not permitted here (unshare --net --pid --mount ... as uid {os.geteuid()}): "
                f"{probe.stderr.strip()}")
    return None


@dataclass
class Node:
    name: str
    address: str
    holder: subprocess.Popen
    pid: int = 0  #: the namespaces' init process, as this process's PID namespace numbers it


@dataclass
class JobResult:
    """An MPI job that ran across the hosts."""

    command: List[str]
    returncode: int
    stdout: str
    stderr: str
    timed_out: bool = False
    #: each rank's stdout lines, when the launcher tagged them with the rank
    outputs: Dict[int, str] = field(default_factory=dict)

    def describe(self) -> str:
        command = " ".join(self.command)
        return f"{command} exited with {self.returncode}\n--- stdout\n{self.stdout}\n--- stderr\n{self.stderr}"


class SimHosts:
    """``count`` simulated hosts named ``h0``, ``h1``, ... and a head node; use as a context
    manager (or call :meth:`close`). :attr:`shared` is a directory every host sees (as a
    cluster's shared filesystem), unlike their private ``/tmp``."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.names = [f"h{i}" for i in range(count)]
        _remove_stale_shared()
        self.shared = Path(tempfile.mkdtemp(prefix=f"{SHARED_PREFIX}{os.getpid()}-", dir=SHARED_PARENT))
        self.hosts: List[Node] = []
        self.head: Optional[Node] = None
        self.switch: Optional[Node] = None
        _OPEN.append(self)
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> "SimHosts":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- making and removing the namespaces ----------------------------------------------------

    def _start(self) -> None:
        hosts_file = self.shared / "etc-hosts"
        lines = ["127.0.0.1 localhost", f"{HEAD_ADDRESS} head"]
        lines += [f"{SUBNET.format(i + 1)} {name}" for i, name in enumerate(self.names)]
        hosts_file.write_text("\n".join(lines) + "\n")
        self.switch = self._spawn("switch", "", ["--net"], "ip link add br0 type bridge && ip link set br0 up")
        self.head = self._spawn(
            "head", HEAD_ADDRESS, ["--net", "--uts", "--mount", "--propagation", "private"],
            f"hostname head && mount --bind {shlex.quote(str(hosts_file))} /etc/hosts",
        )
        for i, name in enumerate(self.names):
            self.hosts.append(self._spawn(
                name, SUBNET.format(i + 1),
                [*HOST_NAMESPACES, "--fork", "--kill-child", "--mount-proc", "--propagation", "private"],
                f"hostname {name} && mount --bind {shlex.quote(str(hosts_file))} /etc/hosts && {self._private_tmp()}",
            ))
        for node in (self.head, *self.hosts):
            self._wait_ready(node)
        self._wait_ready(self.switch)
        for number, node in enumerate((self.head, *self.hosts)):
            port = f"port{number}"
            self._ip(self.switch, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", str(node.pid))
            self._ip(self.switch, "link", "set", port, "master", "br0", "up")
            self._ip(node, "addr", "add", f"{node.address}/24", "dev", "eth0")
            self._ip(node, "link", "set", "eth0", "up")

    def _private_tmp(self) -> str:
        """Shell commands that give a host an empty ``/dev/shm`` and ``/tmp`` of its own, keeping
        visible what the jobs need from there (the checkout, the Python environment: a CI clone
        may live under /tmp)."""
        needed = sorted({p for p in (ROOT, Path(sys.prefix).resolve()) if p.parts[1:2] == ("tmp",)})
        steps = []
        for number, path in enumerate(needed):  # bind each aside before the tmpfs hides it, then back
            aside = self.shared / f"keep{number}"
            aside.mkdir(exist_ok=True)
            steps.append(f"mount --bind {shlex.quote(str(path))} {shlex.quote(str(aside))}")
        steps += ["mount -t tmpfs -o mode=1777 simhost-shm /dev/shm", "mount -t tmpfs -o mode=1777 simhost-tmp /tmp"]
        for number, path in enumerate(needed):
            aside, target = shlex.quote(str(self.shared / f"keep{number}")), shlex.quote(str(path))
            steps += [f"mkdir -p {target}", f"mount --bind {aside} {target}"]
        return " && ".join(steps)

    def _spawn(self, name: str, address: str, flags: Sequence[str], setup: str) -> Node:
        script = f"set -e; ip link set lo up; {setup}; echo ready; read _ || true"
        holder = subprocess.Popen(
            ["unshare", *flags, "sh", "-c", script],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        return Node(name, address, holder)

    @staticmethod
    def _wait_ready(node: Node) -> None:
        line = node.holder.stdout.readline() if node.holder.stdout else ""
        if line.strip() != "ready":
            error = node.holder.stderr.read() if node.holder.stderr else ""
            raise RuntimeError(f"simulated host {node.name} did not start: {line}{error}")
        node.pid = node.holder.pid
        children = Path(f"/proc/{node.holder.pid}/task/{node.holder.pid}/children")
        if children.exists() and children.read_text().split():  # with --fork, init is unshare's child
            node.pid = int(children.read_text().split()[0])

    def _ip(self, node: Node, *args: str) -> None:
        command = ["nsenter", "-t", str(node.pid), "--net", "ip", *args]
        subprocess.run(command, check=True, capture_output=True, text=True, timeout=30)

    def close(self) -> None:
        """Remove everything: each init sees end of file on its stdin and exits, which kills
        what is left in its namespaces; stragglers are killed."""
        nodes = [n for n in (*self.hosts, self.head, self.switch) if n is not None]
        for node in nodes:
            if node.holder.stdin and not node.holder.stdin.closed:
                try:
                    node.holder.stdin.close()
                except OSError:
                    pass
        deadline = time.monotonic() + 10
        for node in nodes:
            try:
                node.holder.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                for pid in {node.pid, node.holder.pid}:
                    _kill(pid)
                node.holder.wait(10)
            for stream in (node.holder.stdout, node.holder.stderr):
                if stream:
                    stream.close()
        self.hosts, self.head, self.switch = [], None, None
        shutil.rmtree(self.shared, ignore_errors=True)
        if self in _OPEN:
            _OPEN.remove(self)

    # -- running things on the hosts -----------------------------------------------------------

    def environment(self, env: Optional[Dict[str, str]] = None) -> Dict[str, str]:
        """This process's environment for a job on the hosts, with ``env`` on top."""
        environment = dict(os.environ)
        environment["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), environment.get("PYTHONPATH")]))
        environment["SIMHOSTS"] = " ".join(f"{h.name}:{h.pid}" for h in self.hosts)
        environment.setdefault("DENSECCL_TIMEOUT", "60")
        environment.update(env or {})
        return environment

    def run_on(self, host: str, argv: Sequence[str], timeout: float = 60) -> subprocess.CompletedProcess:
        """Run ``argv`` on one host ("head" or a host name), as ssh would."""
        node = self.head if host == "head" else self.hosts[self.names.index(host)]
        assert node is not None
        kinds = ["--net", "--uts", "--mount"] if node is self.head else list(HOST_NAMESPACES)
        command = ["nsenter", "-t", str(node.pid), *kinds, f"--wd={ROOT}", *argv]
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=self.environment())

    def mpiexec(
        self,
        argv: Sequence[str],
        *,
        hosts: int,
        per_host: int,
        env: Optional[Dict[str, str]] = None,
        timeout: float = 120,
        expect_failure: Optional[bool] = False,
        launcher: Optional[Sequence[str]] = None,
        hostfile: bool = False,
    ) -> JobResult:
        """Run ``argv`` (a Python script and its arguments) as an MPI job of ``hosts`` x
        ``per_host`` ranks, ranks ``i*per_host ...`` on host ``h<i>``, started by the mpiexec
        beside this interpreter on the head node. Asserts the exit status like
        ``tests.support.ranks.run_ranks``; kills the whole job on timeout and anything it left on
        the hosts, and then fails, except with ``expect_failure=None``, which asserts nothing:
        the caller's checks of what the ranks printed decide. Ranks that leave by ``os._exit``
        (timed-out requests never complete) can leave Open MPI's launcher stuck in the abort of
        a rank whose peers' sockets closed first, after every rank has reported. ``hostfile``:
        name the hosts and their slots in a hostfile (each launcher's format) instead of on the
        command line."""
        assert self.head is not None and 1 <= hosts <= self.count
        names = self.names[:hosts]
        mpiexec = launcher or [ranks.mpiexec()]
        flavour = ranks.flavour(mpiexec[0])
        placement = self._placement(flavour, names, per_host, hostfile)
        if flavour == "openmpi":
            command = [*mpiexec, *placement, "-n", str(hosts * per_host), "--tag-output",
                       "--mca", "plm_rsh_agent", str(RSH)]
        else:
            command = [*mpiexec, "-launcher", "ssh", "-launcher-exec", str(RSH), *placement,
                       "-n", str(hosts * per_host), "-prepend-rank"]
        command += [sys.executable, *argv]
        environment = self.environment(ranks.launch(mpiexec[0], hosts * per_host)[1])
        environment.update(env or {})
        process = subprocess.Popen(
            ["nsenter", "-t", str(self.head.pid), "--net", "--uts", "--mount", f"--wd={ROOT}", *command],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment, start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        timed_out = False
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill(-process.pid)
            self.reap()
            stdout, stderr = process.communicate()
        finally:
            self.reap()
        result = JobResult(command, process.returncode, stdout, stderr, timed_out, split_by_rank(stdout))
        if timed_out and expect_failure is not None:
            raise AssertionError(f"did not finish within {timeout} s: {result.describe()}")
        if expect_failure is not None and (result.returncode != 0) != expect_failure:
            raise AssertionError(result.describe())
        return result

    def torchrun(
        self,
        argv: Sequence[str],
        *,
        hosts: int,
        per_host: int,
        env: Optional[Dict[str, str]] = None,
        timeout: float = 120,
    ) -> JobResult:
        """Run ``argv`` (a Python script and its arguments) under torchrun on each of ``hosts``
        hosts with ``per_host`` ranks each (ranks ``i*per_host ...`` on host ``h<i>``), meeting on
        the store of h0's agent, as a multi-node torchrun job does; no MPI anywhere. Each host's
        output is gathered (``outputs``: by host index); ``returncode``: the first nonzero one."""
        assert 1 <= hosts <= self.count
        master = self.hosts[0].address
        port = "29400"  # inside the hosts' own network namespaces: no other job can hold it
        environment = {k: v for k, v in self.environment(env).items() if k not in MPI_LAUNCH_VARIABLES}
        processes = []
        for index in range(hosts):
            command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(hosts), "--nproc-per-node",
                       str(per_host), "--node-rank", str(index), "--master-addr", master, "--master-port", port,
                       *argv]
            kinds = list(HOST_NAMESPACES)
            processes.append(subprocess.Popen(
                ["nsenter", "-t", str(self.hosts[index].pid), *kinds, f"--wd={ROOT}", *command],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=environment,
                start_new_session=True, preexec_fn=_die_with_parent,
            ))
        outputs, timed_out, deadline = {}, False, time.monotonic() + timeout
        try:
            for index, process in enumerate(processes):
                try:
                    outputs[index], _ = process.communicate(timeout=max(1.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    timed_out = True
                    _kill(-process.pid)
                    outputs[index], _ = process.communicate()
        finally:
            for process in processes:
                if process.poll() is None:
                    _kill(-process.pid)
            self.reap()
        codes = [process.returncode for process in processes]
        result = JobResult(["torchrun", *argv], next((c for c in codes if c), 0), "\n".join(outputs.values()), "",
                           timed_out, outputs)
        if timed_out or result.returncode:
            raise AssertionError(result.describe())
        return result

    def _placement(self, flavour: str, names: Sequence[str], per_host: int, hostfile: bool) -> List[str]:
        """Launcher options that put ``per_host`` ranks on each of ``names``, in order."""
        if not hostfile:
            if flavour == "openmpi":
                return ["--host", ",".join(f"{name}:{per_host}" for name in names)]
            return ["-hosts", ",".join(names), "-ppn", str(per_host)]
        path = self.shared / f"hostfile-{flavour}-{len(names)}x{per_host}"
        lines = [f"{name} slots={per_host}" if flavour == "openmpi" else f"{name}:{per_host}" for name in names]
        path.write_text("\n".join(lines) + "\n")
        return ["--hostfile" if flavour == "openmpi" else "-f", str(path)]

    def reap(self) -> None:
        """Kill every process left on the hosts (all but their init) and empty their
        ``/dev/shm``: each job starts on clean hosts."""
        inits = {_namespace(h.pid, "pid"): h.pid for h in self.hosts}
        for entry in Path("/proc").iterdir():
            pid = int(entry.name) if entry.name.isdigit() else 0
            if pid and pid not in inits.values() and _namespace(pid, "pid") in inits:
                _kill(pid)
        for host in self.hosts:
            # /dev/shm is the host's own tmpfs (-xdev: never into a mount inside it); its /tmp may
            # hold the checkout (see _private_tmp) and is left alone until teardown
            empty = ["find", "/dev/shm", "-xdev", "-mindepth", "1", "-delete"]
            subprocess.run(["nsenter", "-t", str(host.pid), "--mount", *empty], capture_output=True, timeout=30)


def split_by_rank(stdout: str) -> Dict[int, str]:
    """Each rank's lines of a job's stdout: hydra's ``[r] `` prefixes (-prepend-rank) or
    Open MPI's ``[jobid,r]<stdout>:`` tags (--tag-output)."""
    outputs: Dict[int, List[str]] = {}
    for line in stdout.splitlines():
        match = re.match(r"^\[(?:\d+,)?(\d+)\](?:<stdout>)?:?\s?(.*)$", line)
        if match:
            text = re.sub(r"\[\d+\] $", "", match.group(2))  # hydra tags the start of a line it has not seen yet
            outputs.setdefault(int(match.group(1)), []).append(text)
    return {rank: "\n".join(lines) for rank, lines in outputs.items()}


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when this process dies, however it dies (mpiexec on the
    head node is in no PID namespace that would take it down)."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _remove_stale_shared() -> None:
    """Shared directories of sessions that died without closing their hosts."""
    for path in Path(SHARED_PARENT).glob(f"{SHARED_PREFIX}*"):
        owner = path.name[len(SHARED_PREFIX):].split("-")[0]
        if owner.isdigit() and not Path(f"/proc/{owner}").exists():
            shutil.rmtree(path, ignore_errors=True)


def _namespace(pid: int, kind: str) -> Optional[str]:
    try:
        return os.readlink(f"/proc/{pid}/ns/{kind}")
    except OSError:
        return None


def _kill(pid: int) -> None:
    try:
        if pid < 0:
            os.killpg(-pid, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


_OPEN: List[SimHosts] = []



@atexit.register
def _close_all() -> None:
    for hosts in list(_OPEN):
        hosts.close()
