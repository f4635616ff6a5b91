"""load_config: defaults, file, environment, and errors that always name the key."""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from aivedio.cli import main as cli
from aivedio.config.load import claim_poll_seconds, load_config, masked
from aivedio.errors import ConfigError

KEY = base64.b64encode(b"k" * 32).decode()
SECRET_ENV = {"AIVEDIO_URL_ENCRYPTION_KEY": KEY}
KEY_NAME = "security.url_encryption_key"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in list(os.environ):
        if name.startswith("AIVEDIO_"):
            monkeypatch.delenv(name)
    yield
    structlog.reset_defaults()  # the CLI configures structlog globally


def write(tmp_path: Path, text: str, name: str = "aivedio.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def config_error(path: Path | None = None, **env: str) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(path, {**SECRET_ENV, **env})
    return info.value.detail


def test_defaults_load_when_only_the_secret_is_given() -> None:
    config = load_config(None, SECRET_ENV)
    assert config.database.url == "postgresql://postgres@127.0.0.1:5432/aivedio"
    assert config.storage.url == "file:///var/tmp/aivedio/objects"
    assert config.worker.drain_timeout_seconds == 30.0
    assert {name: lane.slots for name, lane in config.worker.lanes.items()} == {
        "fetch": 16,
        "media": 2,
        "control": 8,
    }
    assert config.url_encryption_key_bytes == b"k" * 32


def test_file_values_override_defaults(tmp_path: Path) -> None:
    path = write(tmp_path, "[worker]\ndrain_timeout_seconds = 12.5\n[log]\nlevel = 'debug'\n")
    config = load_config(path, SECRET_ENV)
    assert config.worker.drain_timeout_seconds == 12.5
    assert config.log.level == "debug"


@pytest.mark.parametrize(
    ("toml", "key"),
    [
        ("[worker]\nbogus = 1\n", "worker.bogus"),
        ("[bogus]\na = 1\n", "bogus"),
        ("bogus = 1\n", "bogus"),
    ],
)
def test_unknown_key_in_file_names_the_dotted_key(tmp_path: Path, toml: str, key: str) -> None:
    detail = config_error(write(tmp_path, toml))
    assert f"{key}: unknown key" in detail


def test_unknown_key_inside_a_lane_names_the_lane(tmp_path: Path) -> None:
    detail = config_error(write(tmp_path, "[worker.lanes.fetch]\nslots = 1\nx = 2\n"))
    assert "worker.lanes.fetch.x" in detail


def test_unknown_key_inside_a_lane_is_rejected(tmp_path: Path) -> None:
    detail = config_error(write(tmp_path, "[worker.lanes.fetch]\nslots = 1\nx = 2\n"))
    assert "unknown key" in detail
    assert "worker.lanes" in detail


@pytest.mark.parametrize(
    ("toml", "key"),
    [
        ("[worker]\nhttp_port = 'abc'\n", "worker.http_port"),
        ("[worker]\nlease_seconds = 'long'\n", "worker.lease_seconds"),
        ("[database]\npool_max_size = [1]\n", "database.pool_max_size"),
    ],
)
def test_value_of_wrong_type_names_the_key(tmp_path: Path, toml: str, key: str) -> None:
    assert f"config error: {key}:" in config_error(write(tmp_path, toml))


@pytest.mark.parametrize(
    ("env", "key"),
    [
        ({"AIVEDIO_STORAGE_URL": "file://relative/dir"}, "storage.url"),
        ({"AIVEDIO_STORAGE_URL": "file:relative/dir"}, "storage.url"),
        ({"AIVEDIO_STORAGE_URL": "http://example.com/bucket"}, "storage.url"),
        ({"AIVEDIO_STORAGE_URL": "s3:///no-bucket"}, "storage.url"),
        ({"AIVEDIO_DATABASE_URL": "mysql://db/x"}, "database.url"),
        ({"AIVEDIO_WORKER__HEARTBEAT_INTERVAL_SECONDS": "16"}, "worker.heartbeat_interval_seconds"),
        ({"AIVEDIO_LOG__LEVEL": "loud"}, "log.level"),
        ({"AIVEDIO_LOG__FORMAT": "xml"}, "log.format"),
        ({"AIVEDIO_WORKER__HTTP_PORT": "70000"}, "worker.http_port"),
        ({"AIVEDIO_QUEUE__MAX_ATTEMPTS": "0"}, "queue.max_attempts"),
        ({"AIVEDIO_WORKER__CLAIM_POLL_SECONDS": "0"}, "worker.claim_poll_seconds"),
    ],
)
def test_semantic_error_names_the_key(env: dict[str, str], key: str) -> None:
    assert f"config error: {key}:" in config_error(**env)


def test_heartbeat_of_exactly_half_the_lease_is_accepted() -> None:
    env = {
        "AIVEDIO_WORKER__HEARTBEAT_INTERVAL_SECONDS": "15",
        "AIVEDIO_WORKER__LEASE_SECONDS": "30",
    }
    assert load_config(None, {**SECRET_ENV, **env}).worker.heartbeat_interval_seconds == 15


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        (None, "missing secret"),
        ("", "missing secret"),
        ("not base64 at all!", "not valid base64"),
        (base64.b64encode(b"x" * 16).decode(), "got 16"),
        (base64.b64encode(b"x" * 33).decode(), "got 33"),
    ],
)
def test_bad_or_missing_secret_names_the_key(value: str | None, problem: str) -> None:
    env = {} if value is None else {"AIVEDIO_URL_ENCRYPTION_KEY": value}
    with pytest.raises(ConfigError) as info:
        load_config(None, env)
    assert KEY_NAME in info.value.detail
    assert problem in info.value.detail


def test_env_aliases_beat_the_file(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "[database]\nurl = 'postgresql://file@h/db'\n"
        "[storage]\nurl = 'file:///from/file'\ns3_endpoint_url = 'http://file:9000'\n",
    )
    env = {
        **SECRET_ENV,
        "AIVEDIO_DATABASE_URL": "postgresql://env@h/db",
        "AIVEDIO_STORAGE_URL": "s3://bucket/prefix",
        "AIVEDIO_S3_ENDPOINT_URL": "http://env:9000",
    }
    config = load_config(path, env)
    assert config.database.url == "postgresql://env@h/db"
    assert config.storage.url == "s3://bucket/prefix"
    assert config.storage.s3_endpoint_url == "http://env:9000"


def test_generic_env_override_is_parsed_as_a_number(tmp_path: Path) -> None:
    path = write(tmp_path, "[worker]\ndrain_timeout_seconds = 60\n")
    config = load_config(path, {**SECRET_ENV, "AIVEDIO_WORKER__DRAIN_TIMEOUT_SECONDS": "7"})
    assert config.worker.drain_timeout_seconds == 7.0
    assert isinstance(config.worker.drain_timeout_seconds, float)


def test_env_override_sets_lane_slots() -> None:
    config = load_config(None, {**SECRET_ENV, "AIVEDIO_WORKER__LANES__FETCH__SLOTS": "3"})
    assert config.worker.lanes["fetch"].slots == 3


def test_env_override_of_one_lane_keeps_the_other_default_lanes() -> None:
    config = load_config(None, {**SECRET_ENV, "AIVEDIO_WORKER__LANES__FETCH__SLOTS": "3"})
    assert config.worker.lanes["media"].slots == 2
    assert config.worker.lanes["control"].slots == 8


def test_unknown_key_through_env_names_the_key() -> None:
    assert "worker.bogus: unknown key" in config_error(AIVEDIO_WORKER__BOGUS="1")


def test_config_env_var_picks_the_file_when_path_is_none(tmp_path: Path) -> None:
    path = write(tmp_path, "[worker]\nclaim_batch_max = 5\n")
    config = load_config(None, {**SECRET_ENV, "AIVEDIO_CONFIG": str(path)})
    assert config.worker.claim_batch_max == 5


def test_load_config_reads_os_environ_when_environ_is_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIVEDIO_URL_ENCRYPTION_KEY", KEY)
    monkeypatch.setenv("AIVEDIO_CONFIG", str(write(tmp_path, "[worker]\nack_batch_max = 9\n")))
    assert load_config().worker.ack_batch_max == 9


def test_missing_file_names_the_path(tmp_path: Path) -> None:
    path = tmp_path / "absent.toml"
    detail = config_error(path)
    assert str(path) in detail
    assert "cannot read" in detail


def test_invalid_toml_names_the_path(tmp_path: Path) -> None:
    path = write(tmp_path, "[worker\n")
    detail = config_error(path)
    assert str(path) in detail
    assert "not valid TOML" in detail


def test_masked_hides_the_key_and_the_database_password() -> None:
    env = {**SECRET_ENV, "AIVEDIO_DATABASE_URL": "postgresql://app:hunter2@db:5432/aivedio"}
    data = masked(load_config(None, env))
    assert data["security"]["url_encryption_key"] == "***"
    assert data["database"]["url"] == "postgresql://app:***@db:5432/aivedio"
    rendered = json.dumps(data)
    assert KEY not in rendered
    assert "hunter2" not in rendered


def test_cli_config_check_prints_masked_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("AIVEDIO_URL_ENCRYPTION_KEY", KEY)
    path = write(tmp_path, "[worker]\nclaim_batch_max = 11\n")
    assert cli.main(["config", "check", "--config", str(path)]) == 0
    out = capsys.readouterr().out
    assert KEY not in out
    data = json.loads(out)
    assert data["worker"]["claim_batch_max"] == 11
    assert data["security"]["url_encryption_key"] == "***"


def test_cli_config_check_with_unknown_key_exits_2_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("AIVEDIO_URL_ENCRYPTION_KEY", KEY)
    path = write(tmp_path, "[worker]\nbogus = 1\n")
    assert cli.main(["config", "check", "--config", str(path)]) == 2
    captured = capsys.readouterr()
    assert "worker.bogus" in captured.err
    assert captured.out == ""


def test_masked_hides_passwords_in_any_url_key() -> None:
    env = {
        "AIVEDIO_URL_ENCRYPTION_KEY": KEY,
        "AIVEDIO_S3_ENDPOINT_URL": "https://ak:sekrit@minio:9000",
    }
    assert "sekrit" not in str(masked(load_config(None, environ=env)))


def test_a_provider_may_only_narrow_the_host_suffixes(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text(
        '[net]\nallowed_host_suffixes = ["cdn.example.com"]\n'
        '[providers.acme]\nallowed_host_suffixes = ["evil.test"]\n'
    )
    with pytest.raises(ConfigError, match=r"providers\.acme\.allowed_host_suffixes"):
        load_config(config, environ={"AIVEDIO_URL_ENCRYPTION_KEY": KEY})
    config.write_text(
        '[net]\nallowed_host_suffixes = [".example.com"]\n'
        '[providers.acme]\nallowed_host_suffixes = ["cdn.example.com"]\n'
    )
    loaded = load_config(config, environ={"AIVEDIO_URL_ENCRYPTION_KEY": KEY})
    assert loaded.providers["acme"].allowed_host_suffixes == ["cdn.example.com"]


def test_a_provider_may_not_widen_ports_or_the_byte_cap(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text("[providers.acme]\nallowed_ports = [8443]\n")
    with pytest.raises(ConfigError, match=r"providers\.acme\.allowed_ports"):
        load_config(config, environ={"AIVEDIO_URL_ENCRYPTION_KEY": KEY})
    config.write_text("[providers.acme]\nmax_bytes = 99999999999999\n")
    with pytest.raises(ConfigError, match=r"providers\.acme\.max_bytes"):
        load_config(config, environ={"AIVEDIO_URL_ENCRYPTION_KEY": KEY})


def test_masked_hides_query_strings_in_urls() -> None:
    env = {
        "AIVEDIO_URL_ENCRYPTION_KEY": KEY,
        "AIVEDIO_DATABASE_URL": "postgresql://u@h/db?password=hunter2",
    }
    assert "hunter2" not in str(masked(load_config(None, environ=env)))


@pytest.mark.parametrize(
    ("toml", "key"),
    [
        ("[media]\nnetwork_isolation = 'maybe'\n", "media.network_isolation"),
        ("[media]\ndecode_check = 'some'\n", "media.decode_check"),
        ("[media]\nrequired_outputs = ['playback', 'gif']\n", "media.required_outputs"),
        ("[media]\nrequired_outputs = ['poster']\n", "media.required_outputs"),
        ("[media]\noptional_outputs = ['poster']\n", "media.optional_outputs"),
        ("[[media.ladder]]\nheight = 721\n", "media.ladder[0].height"),
        ("[[media.ladder]]\nheight = 720\ncrf = 60\n", "media.ladder[0].crf"),
        ("[[media.ladder]]\nheight = 720\n[[media.ladder]]\nheight = 720\n", "media.ladder"),
        ("[media]\nladder = []\n", "media.ladder"),
        ("[media]\nsegment_seconds = 0\n", "media.segment_seconds"),
        ("[media]\nwaveform_zooms = [0]\n", "media.waveform_zooms"),
        ("[media]\nposter_at_ratio = 1.5\n", "media.poster_at_ratio"),
        ("[media.tolerances.acme]\nduration_second = 1\n", "media.tolerances.acme"),
        ("[media]\nmin_width = 0\n", "media.min_width"),
        ("[media]\nmin_height = 5000\n", "media.min_height"),
        ("[media]\nmin_duration_seconds = -1\n", "media.min_duration_seconds"),
        ("[media]\nmin_duration_seconds = 4000\n", "media.min_duration_seconds"),
        # Retired: the only cap on streams is max_streams; extra audio streams are ignored.
        ("[media]\nmax_audio_streams = 4\n", "max_audio_streams"),
    ],
)
def test_media_config_errors_name_the_key(tmp_path: Path, toml: str, key: str) -> None:
    path = tmp_path / "c.toml"
    path.write_text(toml)
    with pytest.raises(ConfigError) as info:
        load_config(path, environ={"AIVEDIO_URL_ENCRYPTION_KEY": KEY})
    assert key in info.value.detail


def test_media_ladder_from_toml(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(
        "[[media.ladder]]\nheight = 540\ncrf = 26\n[media.tolerances.acme]\n"
        "duration_seconds = 0.5\n"
    )
    config = load_config(path, environ={"AIVEDIO_URL_ENCRYPTION_KEY": KEY})
    assert [(r.height, r.crf) for r in config.media.ladder] == [(540, 26)]
    assert config.media.tolerances["acme"].duration_seconds == 0.5


def test_claim_poll_defaults_to_five_poll_intervals_unless_set() -> None:
    base = load_config(None, {**SECRET_ENV, "AIVEDIO_WORKER__POLL_INTERVAL_SECONDS": "0.5"})
    assert claim_poll_seconds(base.worker) == 2.5
    env = {**SECRET_ENV, "AIVEDIO_WORKER__CLAIM_POLL_SECONDS": "7"}
    assert claim_poll_seconds(load_config(None, env).worker) == 7.0


def test_the_s3_part_checksum_is_sha256_unless_crc32_is_chosen(tmp_path: Path) -> None:
    assert load_config(None, SECRET_ENV).storage.s3_part_checksum == "sha256"
    path = write(tmp_path, "[storage]\ns3_part_checksum = 'crc32'\n")
    assert load_config(path, SECRET_ENV).storage.s3_part_checksum == "crc32"
    path = write(tmp_path, "[storage]\ns3_part_checksum = 'md5'\n")
    with pytest.raises(ConfigError, match=r"storage\.s3_part_checksum: one of sha256, crc32"):
        load_config(path, SECRET_ENV)
