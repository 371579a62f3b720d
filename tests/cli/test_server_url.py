"""``gpupool server`` / ``gpupool up`` leave the URL clients on this machine use."""

from __future__ import annotations

from pathlib import Path

from gpupool.cli.server import write_server_url
from gpupool.client.config import resolve
from gpupool.control.settings import ServerSettings


def test_the_server_url_file_names_a_reachable_address_and_clients_find_it(
    tmp_path: Path,
) -> None:
    settings = ServerSettings(home=tmp_path, database_url="sqlite://", host="0.0.0.0", port=18471)
    path = write_server_url(settings)
    assert path == tmp_path / "server-url"
    assert path.read_text() == "http://127.0.0.1:18471\n"
    found = resolve(env={"GPUPOOL_HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "cfg")})
    assert found.server == "http://127.0.0.1:18471"
