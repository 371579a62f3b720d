"""What a pool refuses about container jobs, and how a container that cannot start ends.

At submit (422, nothing stored): an image from a registry outside the pool's allowlist (the
answer names the allowlist), an engine no node of the pool has, a malformed image or mount.
At start (BOOT_FAIL with the engine's or the agent's reason): an image that exists nowhere (its
pull is tried once per attempt, the job's requeue policy bounding the attempts: a registry may
be away for a while), an entrypoint missing from the image and a mount of a folder the job's
account may not read (never requeued: every attempt would fail the same way).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.pool import Pool

TIMEOUT = 180.0


def refused(pool: Pool, container: dict[str, Any]) -> tuple[int, str]:
    assert pool.http is not None
    body = {"name": "refused", "script": "true", "container": container}
    r = pool.http.post("/v1/jobs", json={"spec": body})
    return r.status_code, r.text


def test_nodes_report_their_engines_at_registration(cpool: Pool) -> None:
    node = cpool.node("n1")
    assert node is not None
    assert "podman" in node["container_engines"]


def test_an_image_from_a_registry_outside_the_allowlist_is_refused_naming_it(
    cpool: Pool, busybox_image: str
) -> None:
    assert cpool.http is not None
    put = cpool.http.put("/v1/pools/default", json={"image_registries": ["nvcr.io", "*.corp.io"]})
    assert put.status_code in (200, 201), put.text
    try:
        code, text = refused(cpool, {"image": busybox_image})
        assert code == 422
        assert "registry localhost, which pool default does not allow" in text
        assert "nvcr.io, *.corp.io" in text
        code, text = refused(cpool, {"image": "ubuntu:24.04"})  # docker.io, not on the list
        assert (code, "registry docker.io" in text) == (422, True)
        allowed = {"name": "ok", "script": "true", "container": {"image": "a.corp.io/x:1"}}
        held = cpool.http.post("/v1/jobs", json={"spec": allowed, "hold": True})
        assert held.status_code == 201, held.text
        cpool.post(f"/v1/jobs/{held.json()['job']['id']}/cancel", {})
    finally:  # the pool's settings back, whatever happened
        cpool.http.put("/v1/pools/default", json={"image_registries": []})


def test_an_engine_no_node_has_and_bad_references_are_refused_at_submit(
    cpool: Pool, busybox_image: str
) -> None:
    code, text = refused(cpool, {"image": busybox_image, "engine": "docker"})
    assert code == 422
    assert "no node of pool default has container engine docker" in text
    assert "its nodes have podman" in text
    code, text = refused(cpool, {"image": "Not An/Image"})
    assert (code, "is not an image reference" in text) == (422, True)
    code, text = refused(cpool, {"image": busybox_image, "mounts": ["data:/data"]})
    assert (code, "must be an absolute path" in text) == (422, True)


def boot_failed(pool: Pool, name: str, container: dict[str, Any], **spec: Any) -> dict[str, Any]:
    body = {"name": name, "command": ["/bin/echo", "hi"], "container": container, **spec}
    job_id = pool.post("/v1/jobs", {"spec": body})["job"]["id"]
    return pool.wait_state(job_id, "BOOT_FAIL", "FAILED", "COMPLETED", timeout=TIMEOUT)


def test_an_image_that_exists_nowhere_ends_the_attempt_with_the_engines_message(
    cpool: Pool,
) -> None:
    # The default requeue policy: a boot failure goes back to the queue at most max_restarts
    # times, each attempt ending with the engine's message; never an endless loop.
    done = boot_failed(
        cpool, "noimage", {"image": "localhost/gpupool-no-such-image:1"}, max_restarts=1
    )
    assert done["state"] == "BOOT_FAIL", done
    assert done["restart_count"] == 1
    assert "preparing the job failed" in done["reason"]
    assert "localhost/gpupool-no-such-image:1" in done["reason"]  # podman's own words
    # The pull's progress, as the engine wrote it, was a job event while the job started.
    events = cpool.get(f"/v1/jobs/{done['id']}/events")
    pulls = [e["reason"] for e in events if e["source"] == e["target"] == "CONFIGURING"]
    assert pulls, events
    assert all("gpupool-no-such-image:1" in p for p in pulls), pulls


def test_a_missing_entrypoint_is_a_boot_failure_with_the_engines_reason(
    cpool: Pool, busybox_image: str
) -> None:
    body = {"image": busybox_image}
    done = boot_failed(cpool, "noentry", body, command=["/no/such/program"])
    assert done["state"] == "BOOT_FAIL", done
    assert done["restart_count"] == 0  # every attempt would fail the same: never requeued
    assert "/no/such/program" in done["reason"]
    assert "no such file or directory" in done["reason"].lower()


@pytest.fixture
def private_folder() -> Any:
    folder = Path(tempfile.mkdtemp(prefix="gpupool-private-", dir="/tmp"))
    folder.chmod(0o700)  # root's: nobody may not read it
    (folder / "secret").write_text("root only")
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_a_mount_the_jobs_account_may_not_read_is_refused_at_start(
    cpool: Pool, busybox_image: str, private_folder: Path
) -> None:
    body = {"image": busybox_image, "mounts": [f"{private_folder}:/data:ro"]}
    done = boot_failed(cpool, "private", body)
    assert done["state"] == "BOOT_FAIL", done
    assert done["restart_count"] == 0  # the job's own input: not requeued
    assert f"account nobody may not read {private_folder}" in done["reason"]
    done_dir = cpool.state_dir("n1") / "done"
    keys = [
        p.parent.name
        for p in done_dir.glob("*/assignment.json")
        if json.loads(p.read_text())["assignment"]["job_id"] == done["id"]
    ]
    assert keys
    assert not [k for k in keys if (Path("/var/run/cdi") / f"gpupool-{k}.json").exists()]


def test_precheck_names_the_engines_and_what_the_others_lack(
    cpool: Pool, podman_env: dict[str, str]
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "gpupool.cli", "precheck", "--only", "containers"],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert done.stdout.startswith("PASS  containers    engines: podman"), done
    assert "docker:" in done.stdout  # not running here: said, with why
