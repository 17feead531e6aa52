"""Does grpcio honour ``grpc.so_reuseport``, and does the kernel spread connections over
several ``grpc.aio`` servers in separate processes on one port?

N server processes bind one loopback port with ``grpc.so_reuseport`` 1 and answer a unary
call with their pid; C client channels, each on its own TCP connection (a local subchannel
pool: channels of one process otherwise share a connection), call once; the pids tally
which server each connection reached. Then one server is killed and C new connections
dial again: a dead listener should leave the group, so none of them fails. A second
bind with ``grpc.so_reuseport`` 0 shows whether today's guard against a port in use still holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing as mp
import os
from collections import Counter
from typing import Any

import grpc

from seedrl.transport import free_port

METHOD = "/probe.Probe/Pid"
STOP_TIMEOUT_S = 10.0


def _serve(port: int, reuse: int, conn: Any) -> None:
    async def main() -> None:
        async def pid(request: bytes, context: Any) -> bytes:
            return str(os.getpid()).encode()

        handler = grpc.method_handlers_generic_handler(
            "probe.Probe",
            {"Pid": grpc.unary_unary_rpc_method_handler(pid)},
        )
        server = grpc.aio.server(options=[("grpc.so_reuseport", reuse)])
        server.add_generic_rpc_handlers((handler,))
        try:
            bound = server.add_insecure_port(f"127.0.0.1:{port}")
        except RuntimeError:
            bound = 0
        conn.send(bound)
        if not bound:
            return
        await server.start()
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, conn.recv)  # the parent's stop
        await server.stop(0)

    asyncio.run(main())


def probe(servers: int = 4, clients: int = 64) -> dict[str, Any]:
    """Start the servers, dial ``clients`` connections, end every process; the tallies."""
    ctx = mp.get_context("spawn")  # each server starts gRPC fresh, as a frontend would
    port = free_port()
    procs, conns, bound = [], [], []
    try:
        for _ in range(servers):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_serve, args=(port, 1, child))
            p.start()
            procs.append(p)
            conns.append(parent)
            bound.append(parent.recv() if parent.poll(60) else 0)
        guard_parent, guard_child = ctx.Pipe()
        guard = ctx.Process(target=_serve, args=(port, 0, guard_child))
        guard.start()
        procs.append(guard)
        guard_bound = guard_parent.recv() if guard_parent.poll(60) else None
        if guard_bound:
            guard_parent.send("stop")
        pids, _ = _dial(port, clients)
        procs[0].kill()  # a frontend that crashes: its listener leaves the group
        procs[0].join(STOP_TIMEOUT_S)
        after_pids, after_failures = _dial(port, clients)
    finally:
        for c in conns:
            with contextlib.suppress(BrokenPipeError, OSError):
                c.send("stop")
        for p in procs:
            p.join(STOP_TIMEOUT_S)
            if p.is_alive():
                p.kill()
                p.join()
    tally = Counter(pids)
    return {
        "servers": servers,
        "clients": clients,
        "servers_bound": sum(1 for b in bound if b),
        "reuseport0_bind_refused": not guard_bound,
        "connections_per_server": sorted(tally.values(), reverse=True),
        "servers_reached": len(tally),
        "after_kill_servers_reached": len(set(after_pids)),
        "after_kill_failed_calls": after_failures,
    }


def _dial(port: int, clients: int) -> tuple[list[str], int]:
    """The pid each new connection reached, and how many calls failed."""
    options = [("grpc.use_local_subchannel_pool", 1)]
    channels = [grpc.insecure_channel(f"127.0.0.1:{port}", options=options) for _ in range(clients)]
    pids, failures = [], 0
    try:
        for ch in channels:
            try:
                pids.append(ch.unary_unary(METHOD)(b"", timeout=10).decode())
            except grpc.RpcError:
                failures += 1
        return pids, failures
    finally:
        for ch in channels:
            ch.close()
