"""llm-d's EPP flags on ``serve``: pflag forms, value grammars, resolution and warnings."""

from __future__ import annotations

import argparse

import pytest

from ppc_extproc.cli import build_parser, main
from ppc_extproc.cli.llmd import (
    LlmdFlagError,
    chart_argv,
    parse_duration,
    parse_go_bool,
    parse_quantity,
    resolve,
)

#: What llm-d's chart renders for one replica with a pool (config/charts/routerlib/templates/_deployment.yaml).
CHART_ONE = [
    "--pool-name", "qwen", "--pool-namespace", "llm", "--pool-group", "inference.networking.k8s.io",
    "--zap-encoder", "json", "--config-file", "/config/default-plugins.yaml",
    "--grpc-health-port", "9003", "--tracing=false",
]


def parse(argv: list[str]) -> argparse.Namespace:
    return build_parser().parse_args(chart_argv(argv))


def test_leading_flags_mean_serve_with_llmd_defaults() -> None:
    assert chart_argv(CHART_ONE)[:2] == ["serve", "--llm-d-defaults"]
    assert chart_argv(["serve", "--grpc-port", "1"]) == ["serve", "--grpc-port", "1"]
    assert chart_argv(["--version"]) == ["--version"]
    args = parse(CHART_ONE)
    assert args.handler.__name__ == "_serve" and args.pool_name == "qwen" and args.llmd_defaults


@pytest.mark.parametrize(("argv", "expected"), [
    (["--ha-enable-leader-election"], True),
    (["--ha-enable-leader-election=true"], True),
    (["--ha-enable-leader-election=false"], False),
    (["--ha-enable-leader-election=1"], True),
    (["--ha-enable-leader-election=F"], False),
    ([], None),
])
def test_bool_flags_take_pflag_forms(argv: list[str], expected: bool | None) -> None:
    assert parse(["serve", *argv]).llmd_ha_enable_leader_election is expected


def test_value_flags_take_space_and_equals_forms() -> None:
    a = parse(["serve", "--grpc-health-port", "9100", "--drain-timeout=1m30s", "--v=4"])
    b = parse(["serve", "--grpc-health-port=9100", "--drain-timeout", "1m30s", "--v", "4"])
    for args in (a, b):
        assert args.llmd_grpc_health_port == 9100 and args.llmd_drain_timeout == 90.0 and args.llmd_v == 4


@pytest.mark.parametrize("argv", [
    ["--no-such-flag"], ["--grpc-health"], ["--secure-serving=maybe"], ["--drain-timeout=soon"],
    ["--grpc-health-port=70000"], ["--grpc-max-recv-msg-size=lots"],
])
def test_usage_errors_are_one_line_naming_the_flag(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert argv[0].split("=")[0] in err or "--secure-serving" in err


def test_go_bool_is_strconv_parse_bool() -> None:
    assert [parse_go_bool(t) for t in ("1", "t", "T", "TRUE", "true", "True")] == [True] * 6
    assert [parse_go_bool(t) for t in ("0", "f", "F", "FALSE", "false", "False")] == [False] * 6
    with pytest.raises(argparse.ArgumentTypeError):
        parse_go_bool("yes")


@pytest.mark.parametrize(("text", "seconds"), [
    ("0", 0.0), ("30s", 30.0), ("1m30s", 90.0), ("500ms", 0.5), ("1.5h", 5400.0), ("2us", 2e-6),
])
def test_durations_parse_as_go_does(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "30", "-5s", "1x", "s"])
def test_bad_durations_are_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        parse_duration(text)


@pytest.mark.parametrize(("text", "size"), [
    ("10MiB", 10 * 2**20), ("25MB", 25_000_000), ("4194304", 4194304), ("1Gi", 2**30), ("64k", 64000),
    ("1e6", 1_000_000), (" 2Ki ", 2048),
])
def test_quantities_parse_as_kubernetes_does(text: str, size: int) -> None:
    assert parse_quantity(text) == size


@pytest.mark.parametrize("text", ["lots", "25mb", "-1Mi", "1.5", "4Gi"])
def test_bad_quantities_are_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        parse_quantity(text)


def test_chart_mode_takes_llmd_defaults() -> None:
    settings = resolve(parse(CHART_ONE), env={"POD_NAME": "epp-0", "NAMESPACE": "llm"})
    assert settings.grpc_health_port == 9003
    assert settings.drain_timeout_seconds == 30.0
    assert (settings.admin_address, settings.admin_debug) == ("0.0.0.0", False)
    assert settings.log_format == "json"
    assert settings.pod_name == "epp-0"
    assert settings.no_effect == []
    assert settings.metrics_auth  # llm-d's default, though the chart does not render it
    assert not resolve(parse([*CHART_ONE, "--metrics-endpoint-auth=false"]), env={}).metrics_auth
    assert not resolve(parse(["serve"]), env={}).metrics_auth
    assert settings.tls_self_signed and settings.tls_cert_file is None  # llm-d's default: TLS, self-signed


def test_plain_serve_keeps_its_own_defaults() -> None:
    settings = resolve(parse(["serve"]), env={})
    assert settings.grpc_health_port is None and settings.drain_timeout_seconds == 0.0
    assert settings.admin_address is None and settings.admin_debug
    assert settings.no_effect == [] and not settings.tls_self_signed
    assert resolve(parse(["serve", "--secure-serving"]), env={}).tls_self_signed


def test_flags_turning_off_missing_features_do_not_warn() -> None:
    argv = [*CHART_ONE, "--secure-serving=false", "--metrics-endpoint-auth=false", "--enable-pprof=false"]
    assert resolve(parse(argv), env={}).no_effect == []


def test_each_no_effect_flag_is_reported_once() -> None:
    argv = ["serve", "--tracing", "--ha-enable-leader-election", "--refresh-metrics-interval=50ms",
            "--kv-cache-usage-percentage-metric", "sglang:token_usage"]
    names = [name for name, _ in resolve(parse(argv), env={}).no_effect]
    assert sorted(names) == sorted(["refresh-metrics-interval", "kv-cache-usage-percentage-metric"])


def test_leader_election_without_kubernetes_is_one_line_naming_the_flag(capsys: pytest.CaptureFixture[str],
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    import ppc_extproc.observability.logging as logging_module

    # Logging would bind to capsys's stream, closed after this test.
    monkeypatch.setattr(logging_module, "configure_logging", lambda *a, **k: None)
    assert main(["serve", "--endpoints", "127.0.0.1:8000", "--ha-enable-leader-election"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--ha-enable-leader-election" in err and "Traceback" not in err


def test_cert_path_serves_tls_from_its_files() -> None:
    settings = resolve(parse([*CHART_ONE, "--cert-path", "/certs"]), env={})
    assert (settings.tls_cert_file, settings.tls_key_file) == ("/certs/tls.crt", "/certs/tls.key")
    assert not settings.tls_self_signed
    plain = resolve(parse([*CHART_ONE, "--cert-path", "/certs", "--secure-serving=false"]), env={})
    assert plain.tls_cert_file is None and not plain.tls_self_signed


def test_cert_reload_applies_to_certificate_files_and_warns_without_them() -> None:
    settings = resolve(parse([*CHART_ONE, "--cert-path", "/certs", "--enable-cert-reload"]), env={})
    assert settings.tls_cert_reload and settings.no_effect == []
    assert settings.serve_options()["tls_cert_reload"]
    files = resolve(parse(["serve", "--tls-cert-file=a", "--tls-key-file=b", "--enable-cert-reload=true"]), env={})
    assert files.tls_cert_reload and files.no_effect == []
    self_signed = resolve(parse([*CHART_ONE, "--enable-cert-reload"]), env={})
    assert not self_signed.tls_cert_reload
    assert [name for name, _ in self_signed.no_effect] == ["enable-cert-reload"]
    assert resolve(parse([*CHART_ONE, "--enable-cert-reload=false"]), env={}).no_effect == []


def test_logging_flags_map_onto_format_and_level() -> None:
    assert resolve(parse(["serve", "--zap-encoder=console", "--v=4"]), env={}).log_level == "debug"
    assert resolve(parse(["serve", "--v", "2"]), env={}).log_level == "info"
    settings = resolve(parse(["serve", "--v=5", "--zap-log-level=warn"]), env={})
    assert settings.log_level == "warning"  # --zap-log-level wins over --v, as in llm-d
    assert resolve(parse(["serve", "--zap-devel"]), env={}).log_format == "console"
    with pytest.raises(LlmdFlagError, match="--zap-log-level"):
        resolve(parse(["serve", "--zap-log-level=loud"]), env={})


def test_config_text_and_file_are_exclusive() -> None:
    args = parse(["serve", "--config-file", "a.yaml", "--config-text", "kind: EndpointPickerConfig"])
    with pytest.raises(LlmdFlagError, match="--config-file and --config-text"):
        resolve(args, env={})
    assert resolve(parse(["serve", "--config-text", "x: 1"]), env={}).config_text == "x: 1"


def test_message_sizes_and_subset_filter() -> None:
    settings = resolve(parse(["serve", "--grpc-max-recv-msg-size=10MiB", "--disable-endpoint-subset-filter"]), env={})
    assert settings.grpc_max_recv_bytes == 10 * 2**20 and settings.grpc_max_send_bytes is None
    assert settings.honour_subset is False


def test_every_options_go_flag_is_accepted() -> None:
    # pkg/epp/server/options.go AddFlags at llm-d-router ebab687, plus the logging flags.
    flags = [
        "--grpc-port=9002", "--ha-enable-leader-election=false", "--drain-timeout=30s",
        "--grpc-max-recv-msg-size=10MiB", "--grpc-max-send-msg-size=10MiB", "--pool-group=inference.networking.k8s.io",
        "--pool-namespace=llm", "--pool-name=qwen", "--disable-endpoint-subset-filter=false",
        "--refresh-metrics-interval=50ms", "--refresh-prometheus-metrics-interval=5s",
        "--metrics-staleness-threshold=2s", "--total-queued-requests-metric=vllm:num_requests_waiting",
        "--total-running-requests-metric=vllm:num_requests_running",
        "--kv-cache-usage-percentage-metric=vllm:kv_cache_usage_perc", "--lora-info-metric=vllm:lora_requests_info",
        "--cache-info-metric=vllm:cache_config_info", "--v=2", "--zap-encoder=json", "--zap-log-level=info",
        "--zap-devel=false", "--zap-stacktrace-level=error", "--zap-time-encoding=iso8601", "--tracing=false",
        "--health-checking=false", "--metrics-port=9090", "--grpc-health-port=9003", "--enable-pprof=false",
        "--cert-path=/certs", "--enable-cert-reload=false", "--enable-grpc-stream-metrics=false",
        "--secure-serving=true", "--metrics-endpoint-auth=false", "--metrics-client-ca-file=/ca.pem",
        "--metrics-cert-dir=/mcerts", "--config-file=/config/a.yaml", "--allow-experimental-plugins=false",
    ]
    resolve(parse(flags), env={})
    resolve(parse(["--endpoint-selector", "app=vllm", "--endpoint-target-ports", "8000"]), env={})
