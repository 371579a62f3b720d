"""Server and token discovery: flag, then environment, then the login file, then a local pool."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpupool.client.config import (
    DEFAULT_SERVER,
    config_path,
    read_config,
    resolve,
    write_config,
)
from gpupool.client.errors import ConfigError


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    home = tmp_path / "home"
    home.mkdir()
    return {"GPUPOOL_HOME": str(home), "XDG_CONFIG_HOME": str(tmp_path / "xdg")}


def test_each_source_wins_over_the_ones_after_it(env: dict[str, str]) -> None:
    home = Path(env["GPUPOOL_HOME"])
    (home / "admin-token").write_text("gp_local\n")
    (home / "server-url").write_text("http://127.0.0.1:18470\n")
    local = resolve(env=env)
    assert (local.server, local.token) == ("http://127.0.0.1:18470", "gp_local")
    assert local.token_source is not None
    assert local.token_source.startswith("standalone")

    write_config(config_path(env), "http://pool.lab:8470", "gp_file")
    saved = resolve(env=env)
    assert (saved.server, saved.token) == ("http://pool.lab:8470", "gp_file")

    env |= {"GPUPOOL_SERVER": "http://env:1/", "GPUPOOL_TOKEN": "gp_env"}
    from_env = resolve(env=env)
    assert (from_env.server, from_env.token) == ("http://env:1", "gp_env")

    flags = resolve("http://flag:2", "gp_flag", env=env)
    assert (flags.server, flags.token, flags.server_source) == ("http://flag:2", "gp_flag", "flag")


def test_nothing_configured_means_the_default_local_server_and_no_token(
    env: dict[str, str],
) -> None:
    found = resolve(env=env)
    assert found.server == DEFAULT_SERVER
    assert found.token is None


def test_config_file_is_private_and_round_trips(env: dict[str, str]) -> None:
    path = config_path(env)
    write_config(path, "http://a:1", 'gp_"quoted"\\x')
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert read_config(path) == {"server": "http://a:1", "token": 'gp_"quoted"\\x'}


@given(st.text(alphabet=st.characters(blacklist_categories=["Cs", "Cc"]), max_size=60))
def test_any_one_line_token_round_trips(
    tmp_path_factory: pytest.TempPathFactory, token: str
) -> None:
    path = tmp_path_factory.mktemp("cfg") / "config.toml"
    write_config(path, "http://a:1", token)
    assert read_config(path)["token"] == token


def test_bad_config_line_and_bad_url_are_errors_with_a_hint(env: dict[str, str]) -> None:
    path = config_path(env)
    path.parent.mkdir(parents=True)
    path.write_text("server = http://no-quotes\n")
    with pytest.raises(ConfigError, match=r"config.toml:1: expected key = \"value\""):
        resolve(env=env)
    path.unlink()
    with pytest.raises(ConfigError, match="is not a URL: use http://host:port"):
        resolve("pool.lab:8470", env=env)
