"""The console (`GET /ui`, docs/console.md) in a real headless Chromium against a real 3-server cluster.

Debian's Chromium (`make chromium`) driven by Playwright for Python (its own browser download is never
used). The page must load with no console errors, show every server in its rack and every partition's
active and standby where /v1/tables says they are, follow the table's changes live (Server-Sent Events,
filtered on a non-key column), and, within a few seconds of a kill -9, show the killed server down and its
actives on the other servers. Screenshots of both states go to the test's tmp dir (and
to $HOTSTATE_CONSOLE_SHOTS when set: docs/console.png is the failover one).
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from pathlib import Path

import httpx
from playwright.sync_api import (
    BrowserContext,
    ConsoleMessage,
    HttpCredentials,
    Page,
    expect,
    sync_playwright,
)

import hotstate
from hotstate.cli.local_cluster import LocalCluster
from hotstate.client.writer import TableWriter
from hotstate.controller.records import KeyColumn, KeyType
from hotstate.controller.requests import ControllerError

from .conftest import RunningCluster, StartCluster

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
TABLE = "orders"
PARTITIONS = 6
FAILOVER_S = 10.0  # "within a few seconds" on a loaded 2-core machine; measured ~2-3 s


@contextmanager
def browser(profile: Path, credentials: HttpCredentials | None = None) -> Iterator[BrowserContext]:
    """`credentials`: what the browser answers a Basic challenge with (as a user typing them would)."""
    assert CHROMIUM.exists(), f"no {CHROMIUM}: `make chromium` installs Debian's package"
    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(profile),
            executable_path=str(CHROMIUM),
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1360, "height": 900},
            http_credentials=credentials,
        )
        try:
            yield context
        finally:
            context.close()


@contextmanager
def traffic(cluster: LocalCluster, http_port: int) -> Iterator[None]:
    """Queries through one server and writes, so the rates have something to show (errors during the
    failover are expected and ignored: this is load, the assertions are elsewhere)."""
    stop = threading.Event()

    def query() -> None:
        with hotstate.Client(f"127.0.0.1:{http_port}") as client:
            i = 0
            while not stop.is_set():
                with suppress(Exception):
                    client.query(f"SELECT * FROM {TABLE} WHERE k = 'k{i % 50}'")
                i += 1
                stop.wait(0.05)

    def write() -> None:
        async def loop() -> None:
            writer = TableWriter(
                cluster.addresses(), TABLE, cluster_id=cluster.cluster_id, secret=cluster.secret
            )
            try:
                n = 0
                while not stop.is_set():
                    with suppress(Exception):
                        await writer.upsert(
                            [{"k": f"k{(n + j) % 50}", "v": n} for j in range(20)], deadline_s=2
                        )
                    n += 1
                    await asyncio.sleep(0.1)
            finally:
                await writer.close()

        asyncio.run(loop())

    threads = [threading.Thread(target=query, daemon=True), threading.Thread(target=write, daemon=True)]
    for thread in threads:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        for thread in threads:
            thread.join(10)


Placement = dict[int, tuple[int | None, tuple[int, ...]]]  # partition -> (active, standbys)


def api_placement(http_port: int) -> Placement:
    tables = httpx.get(f"http://127.0.0.1:{http_port}/v1/tables", timeout=5).json()["tables"]
    table = next(t for t in tables if t["name"] == TABLE)
    return {p["partition"]: (p["active"], tuple(sorted(p["standbys"]))) for p in table["placement"]}


def shown_placement(page: Page) -> Placement:
    rows = page.eval_on_selector_all(
        f'[data-table="{TABLE}"] tr[data-partition]',
        """rows => rows.map((r) => [
            Number(r.dataset.partition),
            [...r.querySelectorAll('td[data-role="active"]')].map((c) => Number(c.dataset.server)),
            [...r.querySelectorAll('td[data-role="standby"]')].map((c) => Number(c.dataset.server)),
        ])""",
    )
    return {
        p: (actives[0] if len(actives) == 1 else None, tuple(sorted(standbys)))
        for p, actives, standbys in rows
    }


def agreed_placement(page: Page, http_port: int, timeout_s: float = 10.0) -> Placement:
    """The placement once the page shows what /v1/tables says (a reassignment may be under way: both are
    read again until they agree)."""
    end = time.monotonic() + timeout_s
    while True:
        api, shown = api_placement(http_port), shown_placement(page)
        if api == shown and len(api) == PARTITIONS:
            return api
        if time.monotonic() > end:
            raise AssertionError(f"the page shows {shown}, /v1/tables says {api}")
        time.sleep(0.2)


def shown_leader(page: Page, running: RunningCluster, timeout_s: float = 10.0) -> int:
    """The controller leader the page marks, once it is the one the cluster reports."""
    end = time.monotonic() + timeout_s
    while True:
        shown = page.locator('.server[data-leader="true"]').first.get_attribute("data-server")
        with ThreadPoolExecutor(1) as thread:  # asyncio.run: not in this thread, where Playwright's loop runs
            now = thread.submit(running.leader).result()
        if shown is not None and int(shown) == now:
            return now
        if time.monotonic() > end:
            raise AssertionError(
                f"the page marks server {shown} the controller leader, the cluster has {now}"
            )
        time.sleep(0.2)


def shot(page: Page, directory: Path, name: str) -> Path:
    path = directory / name
    page.screenshot(path=str(path), full_page=True)
    target = os.environ.get("HOTSTATE_CONSOLE_SHOTS")
    if target:
        Path(target).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(target) / name)
    return path


def test_the_console_shows_servers_partitions_and_a_failover_in_a_real_browser(
    start_cluster: StartCluster, tmp_path: Path
) -> None:
    running = start_cluster(3)
    cluster = running.cluster
    leader = running.leader()

    async def create() -> None:
        async with cluster.admin(request_timeout_s=2.0) as admin:
            reply = await admin.create_table(
                TABLE,
                partitions=PARTITIONS,
                standby_replicas=1,
                key_columns=(KeyColumn("k", KeyType.STRING),),
            )
            assert reply.error is ControllerError.NONE, reply
        writer = TableWriter(cluster.addresses(), TABLE, cluster_id=cluster.cluster_id, secret=cluster.secret)
        try:
            await writer.upsert([{"k": f"k{i}", "v": i} for i in range(50)])
        finally:
            await writer.close()

    running.run(create())
    page_server = running.server(leader)  # the page comes from the controller leader
    shots = tmp_path / "screenshots"
    shots.mkdir()
    errors: list[str] = []

    def on_console(message: ConsoleMessage) -> None:
        if message.type == "error":
            errors.append(f"console: {message.text}")

    with traffic(cluster, page_server.http_port), browser(tmp_path / "chromium-profile") as context:
        page = context.new_page()
        page.on("console", on_console)
        page.on("pageerror", lambda error: errors.append(f"page error: {error}"))
        page.goto(f"http://127.0.0.1:{page_server.http_port}/ui")

        # Every server, up, in its rack; the controller leader marked: the one the cluster has when the page
        # shows it (on a loaded machine an election may move it after the cluster started).
        expect(page.locator('.server[data-state="up"]')).to_have_count(3, timeout=10_000)
        for server in cluster.servers:
            card = page.locator(f'.rack[data-rack="{server.rack}"] .server[data-server="{server.node_id}"]')
            expect(card).to_have_count(1)
        expect(page.locator('.server[data-leader="true"]')).to_have_count(1)
        expect(page.locator(".badge.leader")).to_have_count(1)
        controller = shown_leader(page, running)

        # Every partition: one active and one standby cell, where /v1/tables puts them.
        expect(page.locator(f'[data-table="{TABLE}"] tr[data-partition]')).to_have_count(PARTITIONS)
        before = agreed_placement(page, page_server.http_port)
        assert all(active is not None and len(standbys) == 1 for active, standbys in before.values()), before
        # The victim: another server than the page's or the controller leader, with the most actives.
        victim = max(
            (s.node_id for s in cluster.servers if s.node_id not in (leader, controller)),
            key=lambda n: sum(active == n for active, _ in before.values()),
        )
        assert any(active == victim for active, _ in before.values()), before
        # The rates once two samples are in: queries go through the page's server, writes to every active.
        rate = re.compile(r"^[0-9.]+k?/s")
        nonzero = re.compile(r"^(?!0\.0/s)[0-9.]+k?/s")
        card = page.locator(f'.server[data-server="{leader}"]')
        expect(card.locator('[data-stat="queries"] dd')).to_have_text(nonzero, timeout=10_000)
        expect(page.locator('#summary [data-stat="rows written"] dd')).to_have_text(nonzero, timeout=10_000)
        for server in cluster.servers:
            stats = page.locator(f'.server[data-server="{server.node_id}"]')
            expect(stats.locator('[data-stat="rows written"] dd')).to_have_text(rate)
        expect(page.locator('.events li[data-kind="table_created"]')).to_have_count(1)

        # The live feed of the table's changes (Server-Sent Events), filtered on a non-key column.
        expect(page.locator("#live-table option")).to_have_count(1, timeout=5_000)
        page.select_option("#live-table", TABLE)
        page.fill("#live-where", "v >= 0")
        page.click("#live-follow")
        expect(page.locator("#live-status")).to_have_attribute("data-state", "live", timeout=10_000)
        upserts = page.locator('#live-changes li[data-kind="upsert"]')
        expect(upserts.nth(4)).to_be_visible(timeout=10_000)  # the writer's changes, as they happen
        expect(upserts.first.locator("code.row")).to_have_text(re.compile(r'^\{"k":"k[0-9]+","v":[0-9]+\}$'))
        healthy = shot(page, shots, "console-healthy.png")
        page.click("#live-stop")
        expect(page.locator("#live-status")).to_have_attribute("data-state", "stopped")
        expect(page.locator("#live-follow")).to_be_enabled()

        running.kill(victim)
        killed_at = time.monotonic()
        expect(page.locator(f'.server[data-server="{victim}"]')).to_have_attribute(
            "data-state", "down", timeout=FAILOVER_S * 1000
        )
        page.wait_for_function(
            """([table, victim, count]) => {
                const rows = document.querySelectorAll(`[data-table="${table}"] tr[data-partition]`);
                return rows.length === count &&
                    [...rows].every((r) => r.dataset.active !== victim && r.dataset.active !== "none");
            }""",
            arg=[TABLE, str(victim), PARTITIONS],
            timeout=FAILOVER_S * 1000,
        )
        moved_after_s = time.monotonic() - killed_at
        after = agreed_placement(page, page_server.http_port)
        assert all(active not in (victim, None) for active, _ in after.values()), after
        expect(page.locator(f'[data-table="{TABLE}"] th.col-down[data-server="{victim}"]')).to_have_count(1)
        expect(page.locator(f'.server[data-server="{victim}"] [data-stat="actives"] dd')).to_have_text("0")
        expect(page.locator('#summary [data-stat="servers up"] dd')).to_have_text("2 / 3")
        rates = httpx.get(f"http://127.0.0.1:{page_server.http_port}/v1/cluster/rates", timeout=5).json()
        by_server = {r["server"]: r for r in rates["rates"]}
        assert by_server[victim]["error"] == "down: no heartbeats from it", rates
        assert by_server[leader]["queries_per_s"] > 0, rates
        moved = page.locator('.events li[data-kind="active_moved"]', has_text=f"from server {victim}")
        expect(moved.first).to_be_visible(timeout=5_000)
        expect(
            page.locator('.events li[data-kind="server_fenced"]', has_text=f"server {victim} fenced")
        ).to_have_count(1, timeout=5_000)
        failover = shot(page, shots, "console-failover.png")

    print(f"screenshots: {healthy} {failover}; actives moved {moved_after_s:.1f} s after the kill")
    assert errors == [], errors


RACK_AS_HTML = "<b>bold</b><script>document.title.concat('injected')</script><i>x</i>"


def test_the_console_puts_api_strings_in_as_text_and_refuses_what_it_does_not_serve(
    start_cluster: StartCluster, tmp_path: Path
) -> None:
    running = start_cluster(1, rack=RACK_AS_HTML)
    port = running.cluster.servers[0].http_port
    with browser(tmp_path / "chromium-profile") as context:
        page = context.new_page()
        page.goto(f"http://127.0.0.1:{port}/ui")
        rack = page.locator(".rack h3")
        expect(rack).to_have_text(f"rack {RACK_AS_HTML}")  # as text: no <b>, no script ran
        expect(page.locator(".rack b, .rack script, .rack i")).to_have_count(0)
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=5) as http:
        answer = http.get("/ui")
        assert answer.status_code == 200
        assert "script-src 'self'" in answer.headers["content-security-policy"]
        assert http.get("/ui/console.js").headers["content-type"].startswith("text/javascript")
        assert http.get("/ui/../server.toml").status_code == 404
        assert http.get("/ui/nothing.js").status_code == 404
        refused = http.get("/v1/events", params={"after": -1})
        assert refused.status_code == 400, refused.text
        assert refused.json()["error_code"] == 40000 and "query.after: " in refused.json()["message"]
        assert http.get("/v1/events", params={"limit": 100_000}).status_code == 400
        events = http.get("/v1/events").json()["events"]
        assert [e["kind"] for e in events] == ["controller_leader", "server_registered", "server_unfenced"]
        assert [e["seq"] for e in http.get("/v1/events", params={"after": 2}).json()["events"]] == [3]
        cluster = http.get("/v1/cluster").json()
        assert [s["state"] for s in cluster["servers"]] == ["up"]
        assert cluster["controller_leader"] == 1
        rates = http.get("/v1/cluster/rates").json()
        assert [r["server"] for r in rates["rates"]] == [1]
        schema = http.get("/openapi.json").json()
        for path in ("/v1/cluster", "/v1/events", "/v1/rates", "/v1/cluster/rates"):
            assert path in schema["paths"], path


def test_with_http_auth_on_the_console_works_once_the_browser_has_credentials(
    start_cluster: StartCluster, tmp_path: Path
) -> None:
    from hotstate.server.http.credentials import hash_password

    path = tmp_path / "credentials.toml"
    path.write_text(f'[users.ops]\nrole = "read"\npassword = "{hash_password("ops-password")}"\n')
    running = start_cluster(3, http_auth_credentials_file=path)
    port = running.server(1).http_port
    assert httpx.get(f"http://127.0.0.1:{port}/ui").status_code == 200  # the page itself is open
    assert httpx.get(f"http://127.0.0.1:{port}/v1/cluster").status_code == 401
    errors: list[str] = []
    with browser(tmp_path / "chromium-profile", {"username": "ops", "password": "ops-password"}) as context:
        page = context.new_page()
        page.on("pageerror", lambda error: errors.append(f"page error: {error}"))
        page.goto(f"http://127.0.0.1:{port}/ui")
        expect(page.locator('.server[data-state="up"]')).to_have_count(3, timeout=10_000)
    assert not errors, errors
