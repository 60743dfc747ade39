"""``serve --workers 2``, the real processes: one port served by two workers (HTTP JSON, SSE and
WebSocket), SIGTERM draining both, a killed worker replaced, and the workers' lifecycle around the
supervisor (the Prometheus multiprocess directory, a supervisor that disappears)."""

from __future__ import annotations

import asyncio
import copy
import functools
import os
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosed

from tests.api.procs import (
    SLOW_TEXT,
    Gateway,
    bearer,
    body,
    completed_text,
    create,
    events,
    parse_sse,
    post_json,
    post_sse,
    read_turn,
    request_pids,
    running,
    slow_reply,
    sse_completed,
    ws,
    ws_turn,
)
from tests.fakes.openai_chat import FakeOpenAIChat
from tests.helpers import fake_fixtures

fake_server, fake = fake_fixtures(FakeOpenAIChat)

DRAIN = 8.0


def config(fake: FakeOpenAIChat | None = None) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "auth": {"api_keys": [{"key": "sk-a", "tenant": "a"}]},
        "models": {"mock": {"provider": "mock"}},
        "limits": {"ws_drain_seconds": DRAIN},
    }
    if fake is not None:
        cfg["providers"] = {"up": {"kind": "openai-chat", "base_url": fake.base_url, "api_key": "sk-up"}}
        cfg["models"]["slow"] = {"provider": "up", "upstream_model": "x"}
    return cfg


def worker_pids(gw: Gateway) -> list[int]:
    return [e["pid"] for e in gw.events("worker_started")]


async def gather_limited(n: int, concurrency: int, make: Any) -> list[Any]:
    gate = asyncio.Semaphore(concurrency)

    async def one(i: int) -> Any:
        async with gate:
            return await make(i)

    return await asyncio.gather(*(one(i) for i in range(n)))


async def test_two_workers_serve_json_sse_and_websocket_on_one_port(tmp_path: Path) -> None:
    async with running(tmp_path, config(), "--workers", "2", workers=2) as gw:
        assert len(gw.events("supervisor_started")) == 1
        assert len(set(worker_pids(gw))) == 2

        async def json_one(i: int) -> None:
            r = await post_json(gw, "sk-a", text=f"json {i}")
            assert r.status_code == 200, r.text
            assert r.json()["status"] == "completed"

        async def sse_one(i: int) -> None:
            assert sse_completed(await post_sse(gw, "sk-a", text=f"sse {i}")).endswith(f"sse {i}")

        async def ws_one(i: int) -> None:
            async with ws(gw, "sk-a") as sock:
                assert completed_text(await ws_turn(sock, "mock", f"ws {i}")).endswith(f"ws {i}")

        await gather_limited(60, 8, json_one)
        await gather_limited(30, 8, sse_one)
        await gather_limited(30, 8, ws_one)
        await gw.wait_log(lambda logs: sum(e.get("event") == "request" for e in logs) >= 120)
        workers = set(worker_pids(gw))
        served = request_pids(gw.logs())
        assert served <= workers
        assert len(served) == 2, "every request went to one worker"
        assert request_pids(gw.logs(), "websocket") <= workers
    assert gw.proc.returncode == 0, gw.tail()


def _logged(request_id: str, logs: list[dict[str, Any]]) -> bool:
    return any(e.get("request_id") == request_id for e in logs)


async def clients_on_each_worker(gw: Gateway, per_worker: int) -> list[httpx.AsyncClient]:
    """Keep-alive clients, ``per_worker`` on each of the two workers: the workers share one listening
    socket, and one of them may accept a whole burst of connections (asyncio accepts every pending
    one at a wakeup), so each client's connection is placed first, by a request whose log line
    names the worker that served it; the connection then stays there."""
    placed: dict[int, list[httpx.AsyncClient]] = {}
    for _ in range(40):
        client = httpx.AsyncClient(base_url=gw.url, timeout=60)
        answer = await client.post("/v1/responses", json=body("mock"), headers=bearer("sk-a"))
        assert answer.status_code == 200, answer.text
        rid = answer.headers["x-request-id"]
        await gw.wait_log(functools.partial(_logged, rid))
        pid = next(e["pid"] for e in gw.logs() if e.get("request_id") == rid)
        clients = placed.setdefault(pid, [])
        if len(clients) < per_worker:
            clients.append(client)
        else:
            await client.aclose()
        if len(placed) == 2 and all(len(c) == per_worker for c in placed.values()):
            return [c for group in placed.values() for c in group]
    raise AssertionError(f"40 connections, placed on workers {sorted(placed)}: one never accepted")


async def test_sigterm_drains_in_flight_streams_on_both_workers(tmp_path: Path, fake: FakeOpenAIChat) -> None:
    fake.default = slow_reply()
    gw = Gateway(tmp_path, config(fake), "--workers", "2")
    clients: list[httpx.AsyncClient] = []
    try:
        await gw.started(2)
        clients = await clients_on_each_worker(gw, 2)
        streams: list[asyncio.Task[Any]] = []

        async def sse(client: httpx.AsyncClient) -> str:
            r = await client.post("/v1/responses", json=body("slow", stream=True), headers=bearer("sk-a"))
            assert r.status_code == 200, r.text
            return sse_completed(parse_sse(r.content))

        async def socket_turn() -> tuple[str, int | None]:
            async with ws(gw, "sk-a") as sock:
                await sock.send(create("slow"))
                text = completed_text(await read_turn(sock))
                with pytest.raises(ConnectionClosed) as closed:
                    await asyncio.wait_for(sock.recv(), 30)  # then the drain closes the socket
                return text, closed.value.rcvd.code if closed.value.rcvd else None

        for client in clients:
            streams.append(asyncio.create_task(sse(client)))
            streams.append(asyncio.create_task(socket_turn()))
        # every stream is under way (the fake has begun answering each) before the signal
        deadline = time.monotonic() + 30
        while len(fake.requests) < 8:
            assert time.monotonic() < deadline, f"{len(fake.requests)} of 8 streams started"
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)
        start = time.monotonic()
        code = await gw.stop(signal.SIGTERM, seconds=DRAIN + 30)
        took = time.monotonic() - start
        results = await asyncio.gather(*streams)
    finally:
        for client in clients:
            await client.aclose()
        gw.close()
    assert code == 0, gw.tail()
    assert took < DRAIN + 4, f"the drain took {took:.1f} s"
    for result in results:
        if isinstance(result, tuple):
            assert result == (SLOW_TEXT, 1001)  # the turn finished, then the socket closed going away
        else:
            assert result == SLOW_TEXT
    logs = gw.logs()
    done = [e for e in logs if e.get("event") == "request" and e.get("model") == "slow"]
    assert len(done) == 8 and all(e["status"] == "completed" for e in done)
    assert len({e["pid"] for e in done if e["transport"] == "http"}) == 2, "the SSE streams' workers"
    exits = [e for e in logs if e.get("event") == "worker_exited"]
    assert len(exits) == 2 and all(e["level"] == "info" for e in exits), exits


async def test_a_killed_worker_is_replaced_and_serving_goes_on(tmp_path: Path) -> None:
    async with running(tmp_path, config(), "--workers", "2", workers=2) as gw:
        first = worker_pids(gw)
        os.kill(first[0], signal.SIGKILL)
        # the other worker serves meanwhile
        for i in range(10):
            assert (await post_json(gw, "sk-a", text=f"during {i}")).status_code == 200
        await gw.wait_log(lambda logs: sum(e.get("event") == "gateway_started" for e in logs) >= 3)
        exited = gw.events("worker_exited")
        assert exited[0]["pid"] == first[0] and exited[0]["returncode"] == -signal.SIGKILL
        replacement = [p for p in worker_pids(gw) if p not in first]
        assert len(replacement) == 1
        for i in range(200):  # until the new worker has served some of them
            assert (await post_json(gw, "sk-a", text=f"after {i}")).status_code == 200
            if replacement[0] in request_pids(gw.logs()):
                break
        assert replacement[0] in request_pids(gw.logs()), "the new worker served nothing"
    assert gw.proc.returncode == 0, gw.tail()


def environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


async def test_workers_share_a_fresh_metrics_dir_and_stop_when_the_supervisor_is_gone(
    tmp_path: Path,
) -> None:
    gw = Gateway(tmp_path, config(), "--workers", "2")
    try:
        await gw.started(2)
        pids = worker_pids(gw)
        dirs = {environ(pid).get("PROMETHEUS_MULTIPROC_DIR") for pid in pids}
        assert len(dirs) == 1 and None not in dirs
        (metrics_dir,) = dirs
        assert metrics_dir is not None and _is_dir(metrics_dir)
        assert "PROMETHEUS_MULTIPROC_DIR" not in os.environ  # set for the workers only
        assert await gw.stop(signal.SIGTERM) == 0
        assert not _is_dir(metrics_dir)  # removed at the end

        # A supervisor killed outright: its workers notice and shut down by themselves.
        (tmp_path / "again").mkdir()
        gw = Gateway(tmp_path / "again", config(), "--workers", "2")
        await gw.started(2)
        pids = worker_pids(gw)
        gw.proc.kill()
        gw.proc.wait()
        deadline = time.monotonic() + DRAIN + 20
        while any(_alive(pid) for pid in pids):
            assert time.monotonic() < deadline, "a worker outlived its supervisor"
            await asyncio.sleep(0.2)
        assert len(gw.events("supervisor_gone")) == 2
    finally:
        gw.close()


def _is_dir(path: str) -> bool:
    return os.path.isdir(path)


def _alive(pid: int) -> bool:
    """Not gone and not a zombie (an orphan is reaped by init, not by this test)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"


async def test_a_worker_that_keeps_dying_is_restarted_with_backoff(tmp_path: Path) -> None:
    cfg = config()
    async with running(tmp_path, cfg, "--workers", "2", workers=2) as gw:
        first = worker_pids(gw)
        broken = copy.deepcopy(cfg)
        broken["models"]["mock"]["provider"] = "nowhere"  # a new worker refuses to start on it
        gw.write(broken)
        os.kill(first[0], signal.SIGKILL)
        await gw.wait_log(lambda logs: len(events(logs, "worker_exited")) >= 4, 90)
        delays = [e["restart_in_seconds"] for e in gw.events("worker_exited")][:4]
        assert delays == [0.0, 0.5, 1.0, 2.0]
        assert [e["returncode"] for e in gw.events("worker_exited")][1:4] == [2, 2, 2]  # config_invalid
        for i in range(5):  # the other worker serves throughout
            assert (await post_json(gw, "sk-a", text=f"meanwhile {i}")).status_code == 200
        gw.write(cfg)  # fixed: the next restart comes up
        await gw.wait_log(lambda logs: len(events(logs, "gateway_started")) >= 3, 90)
    assert gw.proc.returncode == 0, gw.tail()


async def test_a_worker_that_does_not_drain_is_killed_and_the_exit_code_says_so(tmp_path: Path) -> None:
    cfg = config()
    cfg["limits"]["ws_drain_seconds"] = 1
    gw = Gateway(tmp_path, cfg, "--workers", "2")
    try:
        await gw.started(2)
        stuck, healthy = worker_pids(gw)
        os.kill(stuck, signal.SIGSTOP)  # it cannot drain, nor even see the SIGTERM
        start = time.monotonic()
        code = await gw.stop(signal.SIGTERM, seconds=60)
        took = time.monotonic() - start
    finally:
        gw.close()
    assert code == 1
    assert 12 <= took < 30  # the drain (1 s), the cut, then 10 s more before the kill
    (killed,) = gw.events("worker_killed")
    assert killed["pid"] == stuck
    exits = {e["pid"]: e for e in gw.events("worker_exited")}
    assert exits[healthy]["level"] == "info"
    assert exits[stuck]["returncode"] == -signal.SIGKILL and exits[stuck]["level"] == "error"
    assert gw.events("supervisor_stopped")[0]["exit_code"] == 1


async def test_the_metrics_port_is_the_supervisors_and_counts_every_worker(tmp_path: Path) -> None:
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    from tests.harness import free_port

    metrics_port = free_port()
    cfg = {**config(), "metrics": {"port": metrics_port}}
    async with running(tmp_path, cfg, "--workers", "2", workers=2) as gw:

        async def json_one(i: int) -> None:
            r = await post_json(gw, "sk-a", text=f"json {i}")
            assert r.status_code == 200, r.text

        await gather_limited(40, 8, json_one)
        await gw.wait_log(lambda logs: sum(e.get("event") == "request" for e in logs) >= 40)
        assert len(request_pids(gw.logs())) == 2, "every request went to one worker"
        async with httpx.AsyncClient(timeout=30) as client:
            public = await client.get(f"{gw.url}/metrics")
            assert public.status_code == 404  # the separate listener only
            scrape = await client.get(f"http://127.0.0.1:{metrics_port}/metrics")
        assert scrape.status_code == 200
        total = 0.0
        workers_seen = set()
        for family in text_string_to_metric_families(scrape.text):
            for sample in family.samples:
                if sample.name == "gateway_requests_total" and sample.labels.get("transport") == "http":
                    total += sample.value
                if sample.name == "gateway_worker_resident_memory_bytes":
                    workers_seen.add(sample.labels["pid"])
        assert total == 40  # both workers' counts, added up by the supervisor's listener
        assert workers_seen == {str(p) for p in worker_pids(gw)}
    assert gw.proc.returncode == 0, gw.tail()


async def test_workers_without_compaction_keys_share_one_key(tmp_path: Path) -> None:
    """An item compacted by one worker opens on the other: the supervisor gives its workers one
    random key when the config has none (every request below is on a connection of its own)."""
    import httpx

    async with running(tmp_path, config(), "--workers", "2", workers=2) as gw:
        headers = {"authorization": "Bearer sk-a"}
        history = [
            {"type": "message", "role": "user", "content": f"turn {i} " + "words " * 50} for i in range(12)
        ]
        outputs = []
        for _ in range(6):
            async with httpx.AsyncClient(base_url=gw.url, timeout=30) as client:
                r = await client.post(
                    "/v1/responses/compact", json={"model": "mock", "input": history}, headers=headers
                )
                assert r.status_code == 200, r.text
                outputs.append(r.json()["output"])
        assert all(any(i["type"] == "compaction" for i in out) for out in outputs)

        async def reuse(i: int) -> None:
            out = outputs[i % len(outputs)]
            body = {"model": "mock", "store": False, "input": [*out, {"role": "user", "content": "go on"}]}
            async with httpx.AsyncClient(base_url=gw.url, timeout=30) as client:
                r = await client.post("/v1/responses", json=body, headers=headers)
            assert r.status_code == 200, r.text

        await gather_limited(30, 6, reuse)
        await gw.wait_log(lambda logs: sum(e.get("event") == "request" for e in logs) >= 36)
        assert len(request_pids(gw.logs())) == 2, "every request went to one worker"
    assert gw.proc.returncode == 0, gw.tail()
