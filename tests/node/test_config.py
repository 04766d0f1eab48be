"""The node's configuration: file, environment and flags in that order of precedence, and errors
that name the setting and the value (never a secret)."""

from __future__ import annotations

from pathlib import Path

import pytest

from node.config import ConfigError, hash_token, load_config

BASE = {"region.name": "eu-west", "raft.address": "127.0.0.1:7001", "data_dir": "/tmp/xr-test"}


def test_flags_override_environment_which_overrides_the_file(tmp_path: Path) -> None:
    path = tmp_path / "node.toml"
    path.write_text(
        'data_dir = "/var/lib/xr"\n'
        '[region]\nname = "from-file"\nprice_per_gpu_hour = 2.5\nlabels = { zone = "a" }\n'
        '[raft]\naddress = "127.0.0.1:7001"\npeers = ["127.0.0.1:7002", "127.0.0.1:7003"]\n'
        "[http]\nwait_max_s = 30\n"
    )
    config = load_config(
        path=path,
        environ={"XR_REGION_NAME": "from-env", "XR_HTTP_WAIT_MAX_S": "20"},
        overrides={"region.name": "from-flag"},
    )
    assert config.region.name == "from-flag"
    assert config.http.wait_max_s == 20.0
    assert config.region.price_per_gpu_hour == 2.5
    assert config.region.labels == {"zone": "a"}
    assert config.raft.peers == ("127.0.0.1:7002", "127.0.0.1:7003")
    assert config.raft.data_dir == Path("/var/lib/xr/raft")
    assert config.sources["region.name"] == "flag"
    assert config.sources["http.wait_max_s"] == "XR_HTTP_WAIT_MAX_S"


def test_lists_and_labels_come_comma_separated_from_the_environment() -> None:
    config = load_config(
        environ={"XR_RAFT_PEERS": "127.0.0.1:7002, 127.0.0.1:7003", "XR_REGION_LABELS": "a=1,b=2"},
        overrides=BASE,
    )
    assert config.raft.peers == ("127.0.0.1:7002", "127.0.0.1:7003")
    assert config.region.labels == {"a": "1", "b": "2"}


def test_round_trip_times_come_as_region_equals_milliseconds() -> None:
    config = load_config(environ={"XR_REGION_RTT_MS": "eu=75, ap=210.5"}, overrides=BASE)
    assert config.region.rtt_ms == {"eu": 75.0, "ap": 210.5}


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"http.wait_max_s": "soon"}, "http.wait_max_s"),
        ({"http.wait_max_s": "-1"}, "http.wait_max_s"),
        ({"http.address": "nowhere"}, "http.address"),
        ({"raft.address": "127.0.0.1"}, "raft.address: '127.0.0.1' must be host:port"),
        ({"raft.address": "127.0.0.1:99999"}, "raft.address: '127.0.0.1:99999': the port must"),
        ({"raft.peers": "127.0.0.1:7002,nope"}, "raft.peers: 'nope' must be host:port"),
        ({"raft.raft_min_timeout_s": "2"}, "raft.raft_min_timeout_s"),
        ({"region.name": "has space"}, "region.name"),
        ({"log.level": "loud"}, "log.level"),
        ({"raft.unknown": "1"}, "raft.unknown"),
        ({"region.rtt_ms": "eu=fast"}, "region.rtt_ms"),
        ({"region.rtt_ms": "eu=-5"}, "region.rtt_ms"),
        ({"scheduler.preemption_grace_s": "0"}, "scheduler.preemption_grace_s"),
        ({"scheduler.move_ups_max": "-1"}, "scheduler.move_ups_max"),
        ({"scheduler.move_aside_loss_max_s": "-1"}, "scheduler.move_aside_loss_max_s"),
        ({"scheduler.move_aside": "sometimes"}, "scheduler.move_aside"),
        # The scheduler counts whole milliseconds: these would become 0 (session 31's QA pass).
        (
            {"scheduler.preemption_grace_s": "0.0004"},
            "scheduler.preemption_grace_s: must be at least 0.001 s",
        ),
        (
            {"scheduler.default_estimate_s": "0.0001"},
            "scheduler.default_estimate_s: must be at least 0.001 s",
        ),
        (
            {"scheduler.move_up_min_run_s": "0.0005"},
            "scheduler.move_up_min_run_s: must be 0 or at least 0.001 s",
        ),
        ({"scheduler.move_up_saving_fraction": "5"}, "scheduler.move_up_saving_fraction: must be"),
        ({"scheduler.move_up_saving_fraction": "1"}, "scheduler.move_up_saving_fraction: must be"),
        ({"scheduler.seconds_per_dollar": "1e300"}, "scheduler.seconds_per_dollar: must be at"),
        ({"scheduler.seconds_per_kg_carbon": "4e7"}, "scheduler.seconds_per_kg_carbon: must be"),
        ({"region.labels": "speed=fast"}, "region.labels: speed = 'fast' must be a number from"),
        ({"region.labels": "speed=0"}, "region.labels: speed = '0' must be a number from 0.01"),
        ({"region.labels": "speed=101"}, "region.labels: speed = '101' must be a number"),
        ({"region.labels": "speed=nan"}, "region.labels: speed = 'nan' must be a number"),
        # Each worker is told the grace, and takes at most a day.
        ({"executor.kill_grace_s": "100000"}, "executor.kill_grace_s: must be at most 86400"),
        ({"executor.shm_bytes_max": "0"}, "executor.shm_bytes_max: must be positive"),
        ({"executor.shm_bytes_max": "64MiB"}, "executor.shm_bytes_max"),
        ({"executor.private_network": "true"}, "executor.private_network: applies to workers"),
        (
            {
                "executor.private_network": "true",
                "executor.job_user": "nobody",
                "executor.private_tmp": "false",
            },
            "executor.private_network: applies to workers",
        ),
        (
            {"executor.tmp_bytes_max": "0", "executor.job_user": "nobody"},
            "executor.tmp_bytes_max: must be positive",
        ),
        ({"executor.tmp_bytes_max": "1000000"}, "executor.tmp_bytes_max: bounds the /tmp"),
        (
            {
                "executor.tmp_bytes_max": "1000000",
                "executor.job_user": "nobody",
                "executor.private_tmp": "false",
            },
            "executor.tmp_bytes_max: bounds the /tmp",
        ),
        ({"executor.tmp_check_interval_s": "0"}, "executor.tmp_check_interval_s: must be"),
        # Absurd but finite: durations over a year, counts over 2^53, an empty data_dir.
        ({"http.wait_max_s": "1e308"}, "http.wait_max_s: must be at most 31536000 s"),
        ({"executor.retry_backoff_max_s": "31536001"}, "executor.retry_backoff_max_s"),
        ({"raft.background_sync_min_ms": "1e300"}, "raft.background_sync_min_ms"),
        ({"scheduler.default_estimate_s": "1e12"}, "scheduler.default_estimate_s"),
        ({"http.body_bytes_max": str(2**60)}, "body_bytes_max: must be at most 9007199254740992"),
        ({"executor.shm_bytes_max": str(2**60)}, "shm_bytes_max: must be at most 9007"),
        ({"raft.log_compaction_min_entries": str(2**64)}, "raft.log_compaction_min_entries"),
        ({"data_dir": ""}, "data_dir: must not be empty"),
        ({"data_dir": "  "}, "data_dir: must not be empty"),
        ({"raft.cluster_secret": ""}, "raft.cluster_secret: must not be empty"),
    ],
)
def test_an_invalid_setting_is_named_with_its_value(overrides: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        load_config(environ={}, overrides={**BASE, **overrides})


def test_a_missing_required_setting_is_named() -> None:
    with pytest.raises(ConfigError, match="region"):
        load_config(environ={}, overrides={"raft.address": "127.0.0.1:7001", "data_dir": "/x"})


def test_raft_off_loopback_needs_a_cluster_secret_and_the_secret_is_never_shown(
    tmp_path: Path,
) -> None:
    off_loopback = {**BASE, "raft.address": "10.0.0.1:7001"}
    with pytest.raises(ConfigError, match="cluster_secret is required"):
        load_config(environ={}, overrides=off_loopback)
    secret_file = tmp_path / "secret"
    secret_file.write_text("s3cret-value-0123456789\n")
    config = load_config(
        environ={}, overrides={**off_loopback, "raft.cluster_secret_file": str(secret_file)}
    )
    assert config.raft.cluster_secret == "s3cret-value-0123456789"
    with pytest.raises(ConfigError) as raised:
        load_config(
            environ={},
            overrides={
                **off_loopback,
                "raft.cluster_secret": "s3cret-value-0123456789",
                "raft.cluster_secret_file": str(secret_file),
            },
        )
    assert "s3cret" not in str(raised.value)


def test_an_error_in_a_table_does_not_show_the_table_and_its_secrets(tmp_path: Path) -> None:
    """An unknown field in [raft] or in a token's entry showed the whole table, cluster secret
    and token digest included; a wrong value in a table of labels was named `labels....`."""
    path = tmp_path / "node.toml"
    base = 'data_dir = "/tmp/x"\n[region]\nname = "r0"\n'
    for text, named in [
        (
            '[raft]\naddress = "127.0.0.1:7001"\ncluster_secret = "s3cret-value"\nbogus = 1\n',
            "setting raft: Object contains unknown field `bogus`",
        ),
        (
            '[raft]\naddress = "127.0.0.1:7001"\n[[auth.tokens]]\nname = "a"\n'
            'sha256 = "s3cret-value"\nrol = "admin"\n',
            "setting auth.tokens.0: Object contains unknown field `rol`",
        ),
        (
            'labels = { zone = 1 }\n[raft]\naddress = "127.0.0.1:7001"\n',
            "setting region.labels in one of its entries: Expected `str`, got `int`",
        ),
    ]:
        path.write_text(base + text)
        with pytest.raises(ConfigError) as raised:
            load_config(path=path, environ={})
        assert str(raised.value) == named


def test_an_empty_cluster_secret_file_is_refused(tmp_path: Path) -> None:
    # An empty file is a mistake (a secret not yet written, a wrong path), never a choice: a node
    # that read it as "no secret" would talk to its peers unauthenticated.
    for text in ("", "\n", "  \n"):
        secret_file = tmp_path / "secret"
        secret_file.write_text(text)
        with pytest.raises(ConfigError, match=r"raft\.cluster_secret_file: .* is empty"):
            load_config(
                environ={}, overrides={**BASE, "raft.cluster_secret_file": str(secret_file)}
            )


@pytest.mark.parametrize(
    ("secret", "said"),
    [
        ("x", "shorter than 16 bytes"),
        ("fifteen-bytes!!", "shorter than 16 bytes"),
        # deploy/k8s/secret.yaml's value, applied without being replaced.
        ("REPLACE-WITH-openssl-rand-hex-32", "still the placeholder of an example file"),
    ],
)
def test_a_short_or_placeholder_cluster_secret_is_refused_from_a_file_inline_and_the_environment(
    tmp_path: Path, secret: str, said: str
) -> None:
    """A 1-byte secret and deploy/k8s/secret.yaml's placeholder were accepted: the Raft
    traffic's key was then one anybody could guess or read in the repository."""
    secret_file = tmp_path / "secret"
    secret_file.write_text(secret + "\n")
    for dotted, environ, overrides in [
        ("raft.cluster_secret_file", {}, {"raft.cluster_secret_file": str(secret_file)}),
        ("raft.cluster_secret", {}, {"raft.cluster_secret": secret}),
        ("raft.cluster_secret", {"XR_RAFT_CLUSTER_SECRET": secret}, {}),
    ]:
        with pytest.raises(ConfigError) as raised:
            load_config(environ=environ, overrides={**BASE, **overrides})
        message = str(raised.value)
        assert message.startswith(f"setting {dotted}: ") and said in message, message
        assert "openssl rand -hex 32" in message
        if len(secret) > 1:
            assert secret not in message
    sixteen_bytes = "é" * 8  # counted in bytes, as the key is derived from them
    assert load_config(environ={}, overrides={**BASE, "raft.cluster_secret": sixteen_bytes})


def test_node_run_check__refuses_a_placeholder_cluster_secret_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from node.cli import main

    secret_file = tmp_path / "cluster_secret"
    secret_file.write_text("REPLACE-WITH-openssl-rand-hex-32\n")
    arguments = ["node", "run", "--check", "--region", "r0", "--data-dir", str(tmp_path)]
    arguments += ["--raft-address", "127.0.0.1:7001", "--cluster-secret-file", str(secret_file)]
    assert main(arguments) == 2
    error = capsys.readouterr().err
    assert "setting raft.cluster_secret_file: " in error and "openssl rand -hex 32" in error


def test_a_duration_of_a_year_and_a_count_of_2_53_are_accepted() -> None:
    config = load_config(
        environ={},
        overrides={
            **BASE,
            "scheduler.default_estimate_s": str(365 * 24 * 3600),
            "raft.log_compaction_min_entries": str(2**53),
        },
    )
    assert config.scheduler.default_estimate_s == 365 * 24 * 3600
    assert config.raft.log_compaction_min_entries == 2**53


def test_a_bound_on_tmp_is_accepted_for_workers_as_another_user_with_their_own_tmp() -> None:
    config = load_config(
        environ={},
        overrides={**BASE, "executor.tmp_bytes_max": "1000000", "executor.job_user": "nobody"},
    )
    assert config.executor.tmp_bytes_max == 1_000_000


def test_tokens_are_configured_as_digests_with_a_role_and_a_tenant(tmp_path: Path) -> None:
    path = tmp_path / "node.toml"
    digest = hash_token("alice-token")
    path.write_text(
        'data_dir = "/tmp/x"\n[region]\nname = "r0"\n[raft]\naddress = "127.0.0.1:7001"\n'
        f'[[auth.tokens]]\nname = "alice"\nsha256 = "{digest}"\nrole = "tenant"\n'
        'tenant = "team-a"\n'
    )
    config = load_config(path=path, environ={})
    assert config.auth.tokens[0].tenant == "team-a"
    path.write_text(path.read_text().replace('role = "tenant"', 'role = "king"'))
    with pytest.raises(ConfigError, match=r"auth\.tokens\.0\.role"):
        load_config(path=path, environ={})
    path.write_text(path.read_text().replace(digest, "not-a-digest").replace("king", "tenant"))
    with pytest.raises(ConfigError, match="sha256"):
        load_config(path=path, environ={})


def test_a_config_file_that_is_not_toml_is_reported_with_its_path(tmp_path: Path) -> None:
    path = tmp_path / "broken.toml"
    path.write_text("[region\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(path=path, environ={})
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(path=tmp_path / "missing.toml", environ={})


def test_moving_up_can_be_turned_off() -> None:
    assert load_config(environ={}, overrides=BASE).scheduler.move_ups_max == 4
    config = load_config(environ={}, overrides={**BASE, "scheduler.move_ups_max": "0"})
    assert config.scheduler.move_ups_max == 0


def test_moving_aside_can_be_turned_off_and_its_loss_bounded() -> None:
    default = load_config(environ={}, overrides=BASE).scheduler
    assert (default.move_aside, default.move_aside_loss_max_s) == (True, 600.0)
    overrides = {"scheduler.move_aside": "false", "scheduler.move_aside_loss_max_s": "60"}
    config = load_config(environ={}, overrides={**BASE, **overrides}).scheduler
    assert (config.move_aside, config.move_aside_loss_max_s) == (False, 60.0)


def test_syncs_off_the_event_loop_are_on_by_default_and_can_be_turned_off() -> None:
    assert load_config(environ={}, overrides=BASE).raft.background_sync is True
    config = load_config(
        environ={}, overrides={**BASE, "raft.durability": "fsync", "raft.background_sync": "false"}
    )
    assert (config.raft.durability, config.raft.background_sync) == ("fsync", False)
    with pytest.raises(ConfigError, match="background_sync"):
        load_config(environ={}, overrides={**BASE, "raft.background_sync": "sometimes"})


def test_syncs_run_off_the_event_loop_from_a_millisecond_by_default_and_zero_means_always() -> None:
    assert load_config(environ={}, overrides=BASE).raft.background_sync_min_ms == 1.0
    config = load_config(environ={}, overrides={**BASE, "raft.background_sync_min_ms": "0"})
    assert config.raft.background_sync_min_ms == 0
    for bad in ("-1", "nan", "soon"):
        with pytest.raises(ConfigError, match="background_sync_min_ms"):
            load_config(environ={}, overrides={**BASE, "raft.background_sync_min_ms": bad})


@pytest.mark.parametrize(
    ("setting", "choices"),
    [
        ("raft.durability", "write, fsync"),
        ("log.level", "debug, info, warning, error"),
        ("tls.client_certs", "none, optional, required"),
    ],
)
def test_a_value_not_among_a_settings_choices__names_the_choices_once(
    setting: str, choices: str
) -> None:
    # It said "Invalid enum value 'sometimes' (got 'sometimes')" and not what was allowed.
    overrides = {"region.name": "r0", "raft.address": "127.0.0.1:7001", "data_dir": "/tmp/x"}
    with pytest.raises(ConfigError) as raised:
        load_config(environ={}, overrides={**overrides, setting: "sometimes"})
    assert str(raised.value) == f"setting {setting}: must be one of {choices} (got 'sometimes')"


def test_an_api_address_on_the_raft_port__is_refused() -> None:
    # `--check` passed it and the node then failed to listen (exit 1, restarted for ever by a
    # unit that stops restarting on a configuration error's exit 2).
    overrides = {"region.name": "r0", "raft.address": "127.0.0.1:7001", "data_dir": "/tmp/x"}
    for http_address in ("127.0.0.1:7001", "127.0.0.2:7001"):
        with pytest.raises(ConfigError, match=r"which raft\.address"):
            load_config(environ={}, overrides={**overrides, "http.address": http_address})


def test_scheduler_bounds_and_a_speed_label_in_range_are_accepted() -> None:
    overrides = {
        "scheduler.preemption_grace_s": "0.001",
        "scheduler.move_up_min_run_s": "0",
        "scheduler.move_up_saving_fraction": "0.99",
        "scheduler.seconds_per_dollar": str(365 * 24 * 3600),
        "region.labels": "speed=3.5",
    }
    config = load_config(environ={}, overrides={**BASE, **overrides})
    assert config.scheduler.preemption_grace_s == 0.001
    assert config.region.labels == {"speed": "3.5"}
