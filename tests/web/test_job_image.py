"""The dashboard's job page shows the image a job runs in (``gpupool submit --image``) and
what the job adds to it."""

from __future__ import annotations

from typing import Any

from tests.web.pool import LivePool
from tests.web.test_dashboard import sign_in


def test_the_job_page_shows_its_image_mounts_and_engine(page: Any, pool: LivePool) -> None:
    spec = {
        "name": "in-image",
        "command": ["python", "train.py"],
        "resources": {"gpus": "0.5"},
        "container": {
            "image": "nvcr.io/nvidia/pytorch:24.05-py3",
            "mounts": ["/data:/data:ro"],
            "engine": "podman",
        },
    }
    body = {"spec": spec, "hold": True, "queue_anyway": True}  # held: it never starts here
    job_id = pool.call("alice", "POST", "/v1/jobs", body)["job"]["id"]
    try:
        sign_in(page, pool, "alice", f"#/jobs/{job_id}")
        page.wait_for_selector(".facts dt:has-text('Image')")
        shown = page.locator(".facts dt:has-text('Image') + dd").inner_text()
        assert "nvcr.io/nvidia/pytorch:24.05-py3" in shown
        assert "mount /data:/data:ro" in shown
        assert "engine podman" in shown
    finally:
        pool.call("admin", "POST", f"/v1/jobs/{job_id}/cancel", {})
