"""The web dashboard end to end in headless Chromium, against a real three-region cluster with
authentication on and executors running: the page asks for a token, shows the regions, the
leader and the round-trip times; a job submitted through the HTTP API appears and then succeeds
on the page without a reload (live updates); its attempt's log, a lock and a key show; the
browser's console has no errors. Screenshots go to `test-artifacts/` at the repository root (or
`$XR_TEST_ARTIFACTS`).

The page's script against the in-process test node (`tests.node.conftest.ApiNode`): signing out
leaves nothing of the caller in the page, and without a free stream slot the page polls every 2 s
(on Playwright's fake clock: counted, not timed).

Needs Debian's `chromium` and the `playwright` package (its own browser download is not used).
"""

from __future__ import annotations

import importlib.util
import json
import os
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from node.config import hash_token
from node.localcluster import LocalCluster
from tests.node.conftest import TOKENS, ApiNode

CHROMIUM = Path("/usr/bin/chromium")
# `make test` installs both (chromium through apt when root, as in CI). Only a developer run
# without root, where chromium could not be installed, skips; as root a missing browser fails.
if (importlib.util.find_spec("playwright") is None or not CHROMIUM.exists()) and os.geteuid():
    pytest.skip(
        "the browser test needs Debian's chromium (/usr/bin/chromium) and the playwright "
        "package; `make test` installs them when run as root",
        allow_module_level=True,
    )

from playwright.sync_api import (  # noqa: E402
    Browser,
    ConsoleMessage,
    Page,
    Request,
    Response,
    expect,
    sync_playwright,
)

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "ui-browser-secret"
WAIT_S = 60.0
# Page waits, in milliseconds as Playwright takes them.
PAGE_WAIT_MS = 60_000
# Short real waits for a page's requests to be answered, at most (a failsafe).
SETTLE_WAITS_MAX = 4_000
REGIONS = ("r0", "r1", "r2")
# Round-trip times each region reports (what an operator configures), for the heat map.
RTT_MS = {
    "r0": "r1=12,r2=85",
    "r1": "r0=12,r2=140",
    "r2": "r0=85,r1=140",
}


def _artifacts() -> Path:
    directory = Path(os.environ.get("XR_TEST_ARTIFACTS", ROOT / "test-artifacts"))
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def _call(url: str, method: str = "GET", body: Any = None) -> Any:
    request = urllib.request.Request(
        url,
        method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        return json.load(answer)


def _until(condition: Callable[[], Any], what: str) -> Any:
    deadline_s = time.monotonic() + WAIT_S
    while time.monotonic() < deadline_s:
        try:
            value = condition()
        except OSError:
            value = None
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"not within {WAIT_S} s: {what}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    root = Path(tmp_path_factory.mktemp("ui-browser"))
    config = (
        f'[[auth.tokens]]\nname = "viewer"\nsha256 = "{hash_token(TOKEN)}"\n'
        'role = "operator"\ntenant = "web"\n'
    )
    local = LocalCluster(
        root,
        region_names=list(REGIONS),
        config_text=config,
        settings={
            "executor.poll_interval_s": "0.2",
            "executor.checkpoint_dir": str(root / "checkpoints"),
            "region.cpu_slots": "2",
        },
        region_settings={
            name: {"region.rtt_ms": rtt, "region.labels": f"zone={name}-a"}
            for name, rtt in RTT_MS.items()
        },
    )
    try:
        local.start(timeout_s=WAIT_S)
        _until(
            lambda: (
                sum(region["healthy"] for region in _call(f"{local.urls[0]}/v1/regions")["items"])
                == len(REGIONS)
            ),
            "every region is registered and healthy",
        )
        yield local
    finally:
        local.kill()


@pytest.fixture
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=str(CHROMIUM),
            headless=True,
            # Tests may run as root, where Chromium's sandbox cannot start.
            args=["--no-sandbox", "--disable-dev-shm-usage"],
        )
        try:
            yield launched
        finally:
            launched.close()


def test_dashboard__shows_the_cluster_and_a_job_until_it_succeeds(
    cluster: LocalCluster, browser: Browser
) -> None:
    url = cluster.nodes[1].url
    artifacts = _artifacts()
    problems: list[str] = []

    def on_console(message: ConsoleMessage) -> None:
        if message.type == "error":
            problems.append(f"console: {message.text}")

    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.set_default_timeout(PAGE_WAIT_MS)
    page.on("console", on_console)
    page.on("pageerror", lambda error: problems.append(f"page error: {error}"))
    _check_dashboard(page, url, cluster, artifacts)
    assert problems == []


def _check_dashboard(page: Page, url: str, cluster: LocalCluster, artifacts: Path) -> None:
    # Authentication is on: the page asks for a token before it reads anything.
    page.goto(f"{url}/ui")
    page.wait_for_selector("#login:not([hidden])")
    page.fill("#token-input", TOKEN)
    page.click("#login-submit")
    page.wait_for_selector('#live[data-state="live"]')

    # The cluster: every region healthy, the leader, the Raft indexes and the heat map.
    for name in REGIONS:
        page.wait_for_selector(f'.region[data-region="{name}"] .badge.healthy')
    # The leader the API names now (a loaded machine may have elected another since the page
    # loaded; the page follows within a refresh).
    _until(
        lambda: (
            page.inner_text("#leader")
            == page.inner_text("#header-leader")
            == _call(f"{url}/v1/cluster/status")["leader_region"]
        ),
        "the page shows the leader the API names",
    )
    assert int(page.inner_text("#commit-index")) > 0
    assert page.locator("#rtt-table td[title]").count() == 6
    assert "140" in page.inner_text("#rtt-table")
    page.screenshot(path=str(artifacts / "ui-cluster.png"), full_page=True)

    # A job submitted through the API appears, then succeeds, while the page stays open.
    page.click('.tab[data-tab="jobs"]')
    job_id = _call(
        f"{cluster.nodes[0].url}/v1/jobs",
        "POST",
        {"name": "ui-browser", "workload": "gemm", "args": {"n": 64, "repeats": 20}},
    )["job_id"]
    row = f'tr.job[data-job-id="{job_id}"]'
    page.wait_for_selector(row)
    page.wait_for_selector(f'{row}[data-state="succeeded"]')
    assert page.inner_text(f"{row} td.state") == "succeeded"
    # Its attempt and log.
    page.click(row)
    page.click("#job-detail .attempt-list button")
    # (`expect` rather than `wait_for_function`: the page's CSP refuses script from strings.)
    expect(page.locator("#job-log")).not_to_have_text(
        "Choose an attempt to read its log.", timeout=PAGE_WAIT_MS
    )
    assert "could not be read" not in page.inner_text("#job-log")
    # A job no region can run waits, and the page says why.
    waiting_id = _call(
        f"{url}/v1/jobs",
        "POST",
        {"name": "ui-waits", "workload": "gemm", "regions_allow": ["nowhere"]},
    )["job_id"]
    waiting_row = f'tr.job[data-job-id="{waiting_id}"][data-state="pending"]'
    expect(page.locator(f"{waiting_row} td.reason")).not_to_be_empty(timeout=PAGE_WAIT_MS)
    page.screenshot(path=str(artifacts / "ui.png"), full_page=True)

    # A lock with its holder and token; a key in the KV browser.
    session_id = _call(f"{url}/v1/sessions", "POST", {"ttl_ms": 60_000})["session_id"]
    _call(f"{url}/v1/locks/ui-lock/acquire", "POST", {"session_id": session_id})
    _call(f"{url}/v1/kv/ui/greeting", "PUT", {"value": "hello"})
    page.click('.tab[data-tab="locks"]')
    page.wait_for_selector(f'tr[data-lock="ui-lock"] >> text="{session_id}"')
    page.click('.tab[data-tab="kv"]')
    page.fill("#kv-prefix", "ui/")
    page.click("#kv-form button")
    page.wait_for_selector('tr[data-key="ui/greeting"] >> text="hello"')


# The page's script against the in-process test node.


def _sign_in(page: Page, name: str) -> None:
    page.wait_for_selector("#login:not([hidden])")
    page.fill("#token-input", TOKENS[name][0])
    page.click("#login-submit")


# Every part of the page that shows the caller's data, and what the script keeps of it.
_VIEWS = (
    "#node-status",
    "#who",
    "#raft",
    "#regions",
    "#rtt",
    "#job-counts",
    "#jobs tbody",
    "#job-detail",
    "#lock-count",
    "#locks tbody",
    "#session-count",
    "#sessions tbody",
    "#kv tbody",
    "#kv-summary",
    "#kv-value",
)
_CALLER_STATE = "() => [ui.snapshot, ui.selectedJob, ui.logsOf, ui.kvPrefix, ui.kvNext]"
_SIGNED_OUT_STATE = [None, None, None, "", None]


def test_sign_out__leaves_nothing_of_the_caller_in_the_page(api: ApiNode, browser: Browser) -> None:
    region = api.register_region()
    job_id = api.ok("POST", "/v1/jobs", json={"name": "ui-gone", "workload": "gemm"})["job_id"]
    api.start_task(job_id, region, executor_id="ui-gone-executor", lease_ttl_ms=3_600_000)
    api.ok("POST", "/v1/locks/ui-gone-lock/acquire", json={"session_id": api.session()})
    api.ok("PUT", "/v1/kv/ui-gone/key", json={"value": "alpha's value"})
    page = browser.new_page()
    page.set_default_timeout(PAGE_WAIT_MS)
    page.goto(f"{api.client.make_url('/ui')}#jobs")
    _sign_in(page, "alpha")
    # Alpha's job with its attempt's log, its lock, and a key with its value open.
    page.click(f'tr.job[data-job-id="{job_id}"]')
    page.click("#job-detail .attempt-list button")
    expect(page.locator("#job-log")).not_to_have_text("Choose an attempt to read its log.")
    page.click('.tab[data-tab="locks"]')
    page.wait_for_selector('tr[data-lock="ui-gone-lock"]')
    page.click('.tab[data-tab="kv"]')
    page.fill("#kv-prefix", "ui-gone/")
    page.click("#kv-form button")
    page.click('tr[data-key="ui-gone/key"]')
    expect(page.locator("#kv-value")).to_have_text("alpha's value")
    assert page.evaluate(_CALLER_STATE) != _SIGNED_OUT_STATE

    page.click("#sign-out")

    page.wait_for_selector("#login:not([hidden])")
    for selector in _VIEWS:
        assert page.inner_html(selector) == "", selector
    assert page.input_value("#kv-prefix") == ""
    for selector in ("#job-detail", "#kv-value", "#kv-more", "#error"):
        assert page.is_hidden(selector), selector
    assert page.evaluate(_CALLER_STATE) == _SIGNED_OUT_STATE
    # The next caller of the tab, on the KV tab where alpha left: nothing of alpha's.
    _sign_in(page, "beta")
    page.wait_for_selector('#live[data-state="live"]')
    expect(page.locator("#kv-summary")).to_contain_text("key(s) shown")
    content = page.content()
    for alphas in (job_id, "ui-gone", "alpha's value", "tenant alpha"):
        assert alphas not in content, alphas
    assert page.is_hidden("#job-detail")


def test_polling__without_a_stream_slot__reads_the_state_every_2_s(
    api: ApiNode, browser: Browser
) -> None:
    services = api.services
    share = services.config.http.streams_per_tenant_max

    async def take_beta_streams(count: int) -> None:
        services.streams_by_tenant["beta"] += count

    page = browser.new_page()
    page.set_default_timeout(PAGE_WAIT_MS)
    requested: list[Request] = []
    # Requests answered: in full, or (a refused stream, whose body the page does not read) its
    # status and headers.
    answered: set[int] = set()

    def on_response(response: Response) -> None:
        if "/v1/ui/events" in response.url:
            answered.add(id(response.request))

    page.on("request", lambda request: requested.append(request))
    page.on("requestfinished", lambda request: answered.add(id(request)))
    page.on("requestfailed", lambda request: answered.add(id(request)))
    page.on("response", on_response)

    def settle() -> None:
        """Waits until every request the page made is answered and the answer handled (a
        failsafe bound, not a timing: the page's clock stands still meanwhile)."""
        for _ in range(SETTLE_WAITS_MAX):
            if all(id(request) in answered for request in requested):
                # The script's handling of the last answer (a render, a timer set) is queued.
                page.wait_for_timeout(5)
                return
            page.wait_for_timeout(5)
        raise AssertionError(f"requests not answered: {[request.url for request in requested]}")

    # The page's timers on a fake clock, moved by the test.
    page.clock.install()
    # Every stream of tenant beta's share is taken (as by its other dashboards).
    api.run(take_beta_streams(share))
    try:
        page.goto(str(api.client.make_url("/ui")))
        _sign_in(page, "beta")
        expect(page.locator("#live")).to_have_attribute("data-state", "polling")
        # A poll has been answered and rendered; its next one is 2 s away on the page's clock.
        expect(page.locator("#who")).to_contain_text("tenant beta")
        settle()
        first = len(requested)
        badges = set()
        for _ in range(20 * 4):
            page.clock.run_for(250)
            # What a tick sent is answered and handled before the clock moves on.
            settle()
            badges.add(page.get_attribute("#live", "data-state"))
    finally:
        api.run(take_beta_streams(-share))
    paths = [request.url.split("/v1/", 1)[-1] for request in requested[first:]]
    polls = sum(path.startswith("ui/state") for path in paths)
    stream_tries = sum(path.startswith("ui/events") for path in paths)
    # 20 s on the page's clock: a poll every 2 s, and the stream tried again every 10 s.
    assert polls == 10, paths
    assert stream_tries == 2, paths
    assert badges == {"polling"}
