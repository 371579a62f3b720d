"""The dashboard in a real chromium against a live pool (server + agent with simulated GPUs).

Each test signs in through the page with a person's token, as a user would. Screenshots of
every page land in ``test-output/web/``. Accessibility basics (labels, button names,
keyboard reach, text contrast) are checked on the pages the tests visit.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.web.a11y import check_page
from tests.web.pool import GPU_COUNT, NODE, LivePool, wait_for

NAV = ["Overview", "Jobs", "Nodes", "Teams", "Usage"]


def sign_in(page: Any, pool: LivePool, who: str, hash_: str = "") -> None:
    page.goto(f"{pool.url}/{hash_}")
    page.fill("#token", pool.tokens[who])
    page.click("#signin-form button[type=submit]")
    page.wait_for_selector("#nav:not([hidden])")


def mark_page(page: Any) -> None:
    """Set a flag that a reload would erase."""
    page.evaluate("() => { window.__sameDocument = true; }")


def assert_not_reloaded(page: Any) -> None:
    assert page.evaluate("() => window.__sameDocument === true"), "the page reloaded"


def alloc_on_node(page: Any, node: str) -> int:
    return int(
        page.evaluate(
            """(node) => [...document.querySelectorAll(`.gpu[data-node="${node}"]`)]
              .reduce((a, el) => a + Number(el.dataset.allocMilli || 0), 0)""",
            node,
        )
    )


def test_sign_in_by_keyboard_then_overview_shows_the_live_pools_gpus(
    page: Any, pool: LivePool, shots: Path
) -> None:
    page.goto(f"{pool.url}/")
    page.wait_for_selector("#signin:not([hidden])")
    check_page(page, "sign-in")
    page.screenshot(path=str(shots / "sign-in.png"))

    # Tab reaches the token field and the sign-in button, in that order.
    page.evaluate("() => document.activeElement.blur()")
    reached: list[str] = []
    for _ in range(6):
        page.keyboard.press("Tab")
        reached.append(
            page.evaluate(
                "() => document.activeElement.id || document.activeElement.textContent.trim()"
            )
        )
    assert "token" in reached, reached
    assert "Sign in" in reached[reached.index("token") :], reached

    # A wrong token is refused with a message; the right one signs in (typed, then Enter).
    page.focus("#token")
    page.keyboard.type("gp_wrong_token")
    page.keyboard.press("Enter")
    page.wait_for_selector("#signin-error:has-text('refused')")
    page.fill("#token", "")
    page.focus("#token")
    page.keyboard.type(pool.tokens["admin"])
    page.keyboard.press("Enter")
    page.wait_for_selector("#nav:not([hidden])")
    assert page.evaluate("() => sessionStorage.getItem('gpupool.token')") == pool.tokens["admin"]
    assert page.evaluate("() => localStorage.length") == 0

    # Every simulated GPU of the agent is on the grid, with telemetry and its node.
    page.wait_for_function(
        f"() => document.querySelectorAll('.gpu[data-node=\"{NODE}\"]').length === {GPU_COUNT}"
    )
    page.wait_for_function(
        """() => [...document.querySelectorAll('.gpu-foot')]
          .every((e) => e.textContent.includes('°C'))"""
    )
    card = page.locator(".card.pool[data-pool='default']")
    assert card.locator("dd").first.inner_text() == str(GPU_COUNT)
    assert "pending" in card.locator(".queue").inner_text()

    # Keyboard: Tab from the top of the page reaches every navigation link.
    page.evaluate("() => document.activeElement.blur()")
    names: list[str] = []
    for _ in range(10):
        page.keyboard.press("Tab")
        names.append(page.evaluate("() => document.activeElement.textContent.trim()"))
    assert all(n in names for n in NAV), names
    check_page(page, "overview")
    page.screenshot(path=str(shots / "overview.png"), full_page=True)


def test_submitted_job_appears_without_reload_and_its_slice_shows_on_its_gpu(
    page: Any, pool: LivePool, shots: Path
) -> None:
    sign_in(page, pool, "admin")
    page.wait_for_function(
        f"() => document.querySelectorAll('.gpu[data-node=\"{NODE}\"]').length === {GPU_COUNT}"
    )
    page.wait_for_timeout(3500)  # one telemetry sample with the current allocations
    before = alloc_on_node(page, NODE)
    page.click("#nav >> text=Jobs")
    page.wait_for_selector("#jobs-table")
    mark_page(page)

    job_id = pool.submit("alice", "live-job", gpus="0.5")
    row = page.locator(f"#jobs-body tr[data-job='{job_id}']")
    row.wait_for()
    page.wait_for_selector(f"#jobs-body tr[data-job='{job_id}'][data-state='RUNNING']")
    assert "0.5 GPU" in row.inner_text()
    assert_not_reloaded(page)

    # Sorting by a column header orders the rows and says so to assistive technology.
    page.click("#jobs-table th button[data-key='name']")
    page.wait_for_selector("#jobs-table th[aria-sort='ascending'] button[data-key='name']")
    names = page.locator("#jobs-body tr[data-job] td:nth-child(2)").all_inner_texts()
    assert names == sorted(names)
    # Filtering by state asks the server and keeps only matching rows.
    page.select_option("form.filters select[name='state']", "RUNNING")
    page.click("form.filters button[type=submit]")
    page.wait_for_function(
        """() => { const rows = [...document.querySelectorAll('#jobs-body tr[data-job]')];
          return rows.length > 0 && rows.every((r) => r.dataset.state === 'RUNNING'); }"""
    )
    assert page.locator(f"#jobs-body tr[data-job='{job_id}']").count() == 1
    check_page(page, "jobs")
    page.screenshot(path=str(shots / "jobs.png"), full_page=True)

    job = pool.job(job_id)
    assert job["nodes"] == [NODE]
    page.click("#nav >> text=Overview")
    page.wait_for_function(
        """([node, want]) => [...document.querySelectorAll(`.gpu[data-node="${node}"]`)]
          .reduce((a, el) => a + Number(el.dataset.allocMilli || 0), 0) >= want""",
        arg=[NODE, before + 500],
    )
    segments = page.locator(f".gpu[data-node='{NODE}'] .slice")
    assert segments.count() >= 1
    assert_not_reloaded(page)
    pool.call("admin", "POST", f"/v1/jobs/{job_id}/cancel", {})


def test_member_cannot_see_another_teams_job(page: Any, pool: LivePool, shots: Path) -> None:
    theirs = pool.submit("alice", "alice-secret", gpus="0.25")
    mine = pool.submit("bob", "bob-job", gpus="0.25")
    sign_in(page, pool, "bob", "#/jobs")
    page.wait_for_selector(f"#jobs-body tr[data-job='{mine}']")
    assert page.locator(f"#jobs-body tr[data-job='{theirs}']").count() == 0
    assert "alice-secret" not in page.locator("#jobs-table").inner_text()
    # A member has no team filter: it sees one team only.
    assert page.locator("form.filters input[name='tenant']").count() == 0
    # Live updates carry the member's own team only: of two jobs submitted together, its
    # own appears without a reload and the other team's never does.
    theirs_live = pool.submit("alice", "alice-live", gpus="0.25")
    mine_live = pool.submit("bob", "bob-live", gpus="0.25")
    page.wait_for_selector(f"#jobs-body tr[data-job='{mine_live}']")
    pool.wait_state(theirs_live, "RUNNING", "PENDING")
    assert page.locator(f"#jobs-body tr[data-job='{theirs_live}']").count() == 0

    # Opening the other team's job by its address shows "not found", as the API says.
    page.goto(f"{pool.url}/#/jobs/{theirs}")
    page.wait_for_selector("h1:has-text('Job not found')")
    assert page.locator("#cancel").count() == 0
    page.screenshot(path=str(shots / "job-other-team.png"))
    # A member may look at nodes but not drain them: the page offers no such button.
    page.click("#nav >> text=Nodes")
    page.wait_for_selector(f".card.node[data-node='{NODE}']")
    assert page.get_by_role("button", name=f"Drain {NODE}").count() == 0
    for job_id in (theirs, mine, theirs_live, mine_live):
        pool.call("admin", "POST", f"/v1/jobs/{job_id}/cancel", {})


def test_viewer_sees_no_cancel_and_owner_cancels_from_the_job_page(
    page: Any, browser: Any, pool: LivePool, shots: Path
) -> None:
    job_id = pool.submit("alice", "to-cancel", gpus="0.5")
    pool.wait_state(job_id, "RUNNING")

    viewer = browser.new_context().new_page()
    try:
        sign_in(viewer, pool, "carol", f"#/jobs/{job_id}")
        viewer.wait_for_selector("h1:has-text('to-cancel')")
        assert viewer.locator("#cancel").count() == 0
    finally:
        viewer.context.close()

    sign_in(page, pool, "alice", f"#/jobs/{job_id}")
    page.wait_for_selector("h1:has-text('to-cancel')")
    mark_page(page)
    facts = page.locator(".facts").inner_text()
    assert "Isolation" in facts
    assert "0.5 GPU" in facts
    page.wait_for_selector("#job-events td:has-text('RUNNING')")
    page.wait_for_selector(".factors")
    check_page(page, "job page")
    page.screenshot(path=str(shots / "job.png"), full_page=True)

    page.click("#cancel")
    page.click("#confirm-cancel")
    page.wait_for_selector(".job-head .badge:has-text('CANCELLED')", timeout=20_000)
    assert pool.wait_state(job_id, "CANCELLED")["state"] == "CANCELLED"
    assert page.locator("#cancel").count() == 0
    assert_not_reloaded(page)
    page.screenshot(path=str(shots / "job-cancelled.png"), full_page=True)


def test_owner_holds_and_releases_a_pending_job_from_the_job_page(
    page: Any, pool: LivePool, shots: Path
) -> None:
    spec = {"name": "held-at-submit", "command": ["sleep", "60"], "resources": {"gpus": "0.25"}}
    job_id = pool.call("alice", "POST", "/v1/jobs", {"spec": spec, "hold": True})["job"]["id"]
    sign_in(page, pool, "alice", f"#/jobs/{job_id}")
    page.wait_for_selector("h1:has-text('held-at-submit')")
    mark_page(page)
    page.wait_for_selector("#release")
    assert page.locator("#hold").count() == 0
    assert "yes: it starts only once released" in page.locator(".facts").inner_text()
    check_page(page, "held job page")
    page.screenshot(path=str(shots / "job-held.png"), full_page=True)
    page.click("#release")
    page.wait_for_selector(".job-head .badge:has-text('RUNNING')", timeout=20_000)
    assert pool.job(job_id)["held"] is False
    assert page.locator("#release").count() == 0
    assert page.locator("#hold").count() == 0  # running: nothing to hold
    pool.call("admin", "POST", f"/v1/jobs/{job_id}/cancel", {})
    # A job too large for this pool stays pending: hold it from the page.
    big = pool.submit("alice", "too-big", gpus="8", queue_anyway=True)
    page.goto(f"{pool.url}/#/jobs/{big}")
    page.wait_for_selector("h1:has-text('too-big')")
    page.click("#hold")
    page.wait_for_selector("#release")
    assert pool.job(big)["held"] is True
    assert "does not start until released" in page.locator(".status").inner_text()
    assert_not_reloaded(page)
    pool.call("admin", "POST", f"/v1/jobs/{big}/cancel", {})


def test_nodes_teams_and_usage_pages_render_accessibly_and_usage_downloads_csv(
    page: Any, pool: LivePool, shots: Path
) -> None:
    pool.call(
        "admin",
        "PUT",
        "/v1/tenants/team-a/quotas/default",
        {"guaranteed_milli": 1000, "limit_milli": 3000},
    )
    job_id = pool.submit("alice", "for-usage", gpus="1")
    pool.wait_state(job_id, "RUNNING")
    sign_in(page, pool, "admin", "#/nodes")

    node = page.locator(f".card.node[data-node='{NODE}']")
    node.wait_for()
    assert node.locator("tbody tr").count() == GPU_COUNT
    assert "up" in node.locator("h2").inner_text()
    assert node.get_by_role("button", name=f"Drain {NODE}").count() == 1
    # Sparklines draw once this page has two telemetry samples of a device.
    page.wait_for_function(
        f"() => document.querySelectorAll('.spark-line').length >= {3 * GPU_COUNT}",
        timeout=20_000,
    )
    check_page(page, "nodes")
    page.screenshot(path=str(shots / "nodes.png"), full_page=True)
    # Drain and resume from the page (admin holds node:manage); the API agrees each time.
    node.get_by_role("button", name=f"Drain {NODE}").click()
    page.wait_for_selector(f".card.node[data-node='{NODE}'] h2:has-text('draining')")
    assert pool.call("admin", "GET", f"/v1/nodes/{NODE}")["state"] == "draining"
    page.get_by_role("button", name=f"Resume {NODE}").click()
    page.wait_for_selector(f".card.node[data-node='{NODE}'] h2:has-text('up')")
    assert pool.call("admin", "GET", f"/v1/nodes/{NODE}")["state"] == "up"

    page.click("#nav >> text=Teams")
    team = page.locator(".card.team[data-tenant='team-a']")
    team.wait_for()
    quota = team.locator("tr[data-pool='default']")
    quota.wait_for()
    cells = quota.locator("td").all_inner_texts()
    assert cells[1] == "1 GPU"
    assert cells[2] == "3 GPU"
    assert cells[3].startswith("1 GPU")
    # The standing is the scheduler's own figures from the server, not an approximation.
    assert team.locator("dd.decayed").inner_text().endswith("GPU-h (half-life 7 days)")
    factor = pool.call("admin", "GET", "/v1/tenants/team-a")["fair_share_factor"]
    assert 0.0 <= factor <= 1.0
    # (usage accrues while jobs run, so the factor may have moved a little since the page read it)
    assert abs(float(team.locator("dd.standing").inner_text()) - factor) <= 0.02
    check_page(page, "teams")
    page.screenshot(path=str(shots / "teams.png"), full_page=True)

    page.click("#nav >> text=Usage")
    page.wait_for_selector("#usage-charts figure")
    assert page.locator("#usage-charts figure").count() == 4
    check_page(page, "usage")
    page.screenshot(path=str(shots / "usage.png"), full_page=True)
    with page.expect_download() as info:
        page.click("#csv")
    csv = Path(info.value.path()).read_text(encoding="utf-8")
    assert csv.splitlines()[0].startswith("tenant,user,pool,gpu_model,gpu_hours")
    pool.call("admin", "POST", f"/v1/jobs/{job_id}/cancel", {})


def test_pending_job_page_says_why_it_waits(page: Any, pool: LivePool, shots: Path) -> None:
    job_id = pool.submit("alice", "too-big", gpus="8", queue_anyway=True)
    sign_in(page, pool, "alice", f"#/jobs/{job_id}")
    page.wait_for_selector("h1:has-text('too-big')")
    page.wait_for_selector(".facts dt:has-text('Why pending')")
    why = page.locator(".facts dt:has-text('Why pending') + dd").inner_text()
    assert why.strip()
    assert page.locator(".facts dt:has-text('Estimated start')").count() == 1
    assert page.locator("#cancel").count() == 1
    page.screenshot(path=str(shots / "job-pending.png"), full_page=True)
    pool.call("admin", "POST", f"/v1/jobs/{job_id}/cancel", {})


def test_per_job_slices_from_the_server_are_drawn_as_segments_other_teams_anonymous(
    page: Any, pool: LivePool
) -> None:
    """The overview draws each device's slices as the server lists them (``slices`` on
    ``/v1/devices``): a segment per slice, labelled with its job for the viewer's own team and
    anonymous (no job id) for another team's job, whose id never reaches the page."""
    mine = pool.submit("alice", "alice-slice", gpus="0.25")
    theirs = pool.submit("bob", "bob-slice", gpus="0.5")
    for job_id in (mine, theirs):
        pool.wait_state(job_id, "RUNNING")
    where = {s["device_uuid"] for j in (mine, theirs) for s in pool.job(j)["slices"]}
    assert where, "the running jobs list no slices"
    sign_in(page, pool, "alice")

    def drawn(uuid: str) -> list[tuple[str, int]]:
        tile = page.locator(f".gpu[data-uuid='{uuid}']")
        tile.wait_for()
        cells = tile.locator(".slice").evaluate_all(
            "els => els.map((e) => [e.dataset.job, Number(e.dataset.milli)])"
        )
        return [(str(j), int(m)) for j, m in cells]

    def matches() -> bool | None:
        devices = {d["uuid"]: d for d in pool.call("alice", "GET", "/v1/devices")}
        for uuid in where:
            want = [(s["job_id"] or "", s["milli"]) for s in devices[uuid]["slices"]]
            if sorted(drawn(uuid)) != sorted(want):
                return None
        return True

    wait_for(matches, 20, "the overview to draw the server's slices")
    mine_drawn = [m for uuid in where for j, m in drawn(uuid) if j == mine]
    assert mine_drawn == [250]
    anonymous = [m for uuid in where for j, m in drawn(uuid) if j == ""]
    assert 500 in anonymous
    assert page.locator(f".slice[data-job='{theirs}']").count() == 0
    assert theirs not in page.content()
    for job_id in (mine, theirs):
        pool.call("admin", "POST", f"/v1/jobs/{job_id}/cancel", {})
