"""The job page's logs in a real chromium against a live pool: stdout and stderr both shown
(a Python traceback is not hidden), and the whole log downloaded as the job wrote it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from tests.web.a11y import check_page
from tests.web.pool import PY, LivePool, wait_for
from tests.web.test_dashboard import sign_in

PROGRAM = (
    "import sys\n"
    "for i in range(3000): print(f'out line {i}')\n"
    "print('caf\\u00e9 at the end')\n"
    "sys.stdout.flush()\n"
    "raise SystemExit(sys.stderr.write('Traceback (most recent call last):\\n  boom\\n') and 3)\n"
)


def test_the_job_page_shows_stdout_and_stderr_and_downloads_the_whole_log(
    page: Any, pool: LivePool, shots: Path
) -> None:
    spec = {"name": "talker", "command": [PY, "-c", PROGRAM], "resources": {"gpus": "0.25"}}
    job_id = pool.call("alice", "POST", "/v1/jobs", {"spec": spec})["job"]["id"]
    pool.wait_state(job_id, "FAILED", timeout=60)
    whole = "".join(f"out line {i}\n" for i in range(3000)) + "caf\u00e9 at the end\n"

    def shipped() -> bool:
        got = httpx.get(
            f"{pool.url}/v1/jobs/{job_id}/logs?stream=stderr&tail=5",
            headers={"Authorization": f"Bearer {pool.tokens['alice']}"},
        )
        return "boom" in got.text

    wait_for(shipped, 60, "the job's stderr to reach the server")
    sign_in(page, pool, "alice", f"#/jobs/{job_id}")
    page.wait_for_selector("h1:has-text('talker')")
    page.wait_for_selector("#log-stderr:has-text('boom')")
    page.wait_for_selector("#log-stdout:has-text('caf\u00e9 at the end')")
    assert "Traceback (most recent call last)" in page.locator("#log-stderr").inner_text()
    assert "out line 2999" in page.locator("#log-stdout").inner_text()
    check_page(page, "job page logs")
    page.screenshot(path=str(shots / "job-logs.png"), full_page=True)

    with page.expect_download() as info:
        page.click("#download-stdout")
    download = info.value
    assert download.suggested_filename == f"{job_id}.stdout.log"
    assert Path(download.path()).read_bytes() == whole.encode()
