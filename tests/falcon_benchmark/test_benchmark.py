"""The benchmark end to end without AWS: a stand-in CDK CLI (a real subprocess), Stubber-backed AWS clients, and
the loopback fake LMI behind a real sagemaker-runtime client; then its failure, interrupt and teardown paths."""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
from pathlib import Path

import boto3
import pytest
from botocore.stub import Stubber

from inference.llm import loadtest
from inference.llm.falcon_benchmark import cli
from inference.llm.falcon_benchmark.aws import Account, CdkRunner
from tests.fake_lmi import FakeLmi, sagemaker_runtime

pytestmark = pytest.mark.servers  # runs the benchmark against the fake LMI server: make test's servers lane

FAKE_CDK = Path(__file__).with_name("fake_cdk.py")
PREFIX = "mlrecipes-dev"
NOW = datetime.datetime(2026, 12, 2, tzinfo=datetime.UTC)


@pytest.fixture
def fake_aws(monkeypatch, tmp_path):
    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                        "AWS_SESSION_TOKEN": "testing", "AWS_DEFAULT_REGION": "us-west-2",
                        "AWS_EC2_METADATA_DISABLED": "true", "AWS_CONFIG_FILE": str(tmp_path / "none"),
                        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none")}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.delenv("AWS_REGION", raising=False)


@pytest.fixture
def cdk(tmp_path, monkeypatch):
    """The stand-in CLI and a reader of its log: [(verb, stack, context), ...]."""
    log = tmp_path / "cdk.log"
    monkeypatch.setenv("FAKE_CDK_LOG", str(log))
    monkeypatch.delenv("FAKE_CDK_FAIL", raising=False)

    def calls():
        lines = log.read_text().splitlines() if log.exists() else []
        return [(c["verb"], c["stack"], c["context"]) for c in map(json.loads, lines)]

    return CdkRunner(command=(sys.executable, str(FAKE_CDK))), calls


class Aws:
    """Real boto3 clients under Stubbers, answering the calls a run makes, in order."""

    def __init__(self, runtime=None, existing=(), quota=2.0, statuses=("InService",)):
        session = boto3.session.Session(region_name="us-west-2")
        self.clients = {name: session.client(name) for name in ("sts", "ssm", "service-quotas", "cloudformation",
                                                                 "sagemaker")}
        self.stubbers = {name: Stubber(client) for name, client in self.clients.items()}
        s = self.stubbers
        s["sts"].add_response("get_caller_identity", {"Account": "123456789012", "Arn": "arn:aws:iam::123456789012:"
                                                      "user/bench", "UserId": "AIDA"})
        s["ssm"].add_response("get_parameter", {"Parameter": {"Name": "/cdk-bootstrap/hnb659fds/version",
                                                              "Value": "27", "Type": "String"}},
                              {"Name": "/cdk-bootstrap/hnb659fds/version"})
        s["service-quotas"].add_response("list_service_quotas", {"Quotas": [
            {"QuotaName": "ml.g5.2xlarge for endpoint usage", "Value": 4.0},
            {"QuotaName": "ml.g5.48xlarge for endpoint usage", "Value": quota}]}, {"ServiceCode": "sagemaker"})
        for part in ("artifacts", "network", "falcon"):
            name = f"{PREFIX}-{part}"
            if name in existing:
                s["cloudformation"].add_response("describe_stacks", {"Stacks": [
                    {"StackName": name, "StackStatus": "UPDATE_COMPLETE", "CreationTime": NOW}]}, {"StackName": name})
            else:
                s["cloudformation"].add_client_error("describe_stacks", "ValidationError",
                                                     f"Stack with id {name} does not exist",
                                                     expected_params={"StackName": name})
        for status in statuses:
            s["sagemaker"].add_response("describe_endpoint", {
                "EndpointName": "dev-falcon", "EndpointArn": "arn:aws:sagemaker:us-west-2:123456789012:endpoint/"
                "dev-falcon", "EndpointConfigName": "config", "EndpointStatus": status, "CreationTime": NOW,
                "LastModifiedTime": NOW, **({"FailureReason": "CUDA out of memory"} if status == "Failed" else {})},
                {"EndpointName": "dev-falcon"})
        for stubber in self.stubbers.values():
            stubber.activate()
        if runtime is not None:
            self.clients["sagemaker-runtime"] = runtime
        self.account = Account(session, self.clients)


class Switch:
    """Where the fake SageMaker sends requests: the fake server of the mode deployed last."""

    def __init__(self, servers):
        self.servers, self.current = servers, None

    @property
    def server_address(self):
        return self.servers[self.current].server_address


class SwitchingRunner(CdkRunner):
    def __init__(self, base: CdkRunner, switch: Switch):
        super().__init__(command=base.command)
        self.switch = switch

    def deploy(self, stack, context):
        outputs = super().deploy(stack, context)
        self.switch.current = context["falcon.batching"]
        return outputs


def quiet(**overrides):
    return {"sleep": lambda _s: None, "warmup_tries": 2, **overrides}


@pytest.mark.slow
def test_two_modes_end_to_end_against_the_fake_lmi(fake_aws, cdk, tmp_path, monkeypatch, capsys):
    runner, calls = cdk
    servers = {"dynamic": FakeLmi("dynamic", batch_size=4, max_batch_delay_s=0.02, token_s=0.0005),
               "rolling_paged": FakeLmi("rolling", max_rolling=8, prefill_s=0.004, token_s=0.0005)}
    switch = Switch(servers)
    runtime = sagemaker_runtime(switch)
    monkeypatch.setattr(loadtest.SageMakerTarget, "_make_client", staticmethod(lambda *_args: runtime))
    aws = Aws(runtime=runtime, quota=2.0, statuses=("Creating", "InService", "InService"))  # room for 2 fleets
    out = tmp_path / "run"
    with servers["dynamic"], servers["rolling_paged"]:
        status = cli.main(["--env", "dev", "--modes", "dynamic,rolling_paged", "--shapes", "32x128,256x32",
                           "--concurrency", "1,4", "--step-seconds", "0.3", "--out", str(out),
                           "--poll-seconds", "0.01"],
                          account=aws.account, runner=SwitchingRunner(runner, switch), **quiet())
        payloads = {mode: list(server.payloads) for mode, server in servers.items()}
    printed = capsys.readouterr().out
    assert status == 0, printed

    verbs = [(verb, stack, context.get("falcon.batching")) for verb, stack, context in calls()]
    assert verbs == [("synth", f"{PREFIX}-falcon", "dynamic"), ("synth", f"{PREFIX}-falcon", "rolling_paged"),
                     ("deploy", f"{PREFIX}-falcon", "dynamic"), ("deploy", f"{PREFIX}-falcon", "rolling_paged"),
                     ("destroy", f"{PREFIX}-falcon", "rolling_paged"),
                     ("destroy", f"{PREFIX}-network", "rolling_paged"),
                     ("destroy", f"{PREFIX}-artifacts", "rolling_paged")]
    assert all(context["env"] == "dev" and context["falcon.enabled"] == "true" for _, _, context in calls())
    for stubber in aws.stubbers.values():
        stubber.assert_no_pending_responses()

    # Every request carried max_new_tokens; only the rolling mode asked for a stream.
    assert all(p["parameters"]["max_new_tokens"] in (16, 128, 32) for ps in payloads.values() for p in ps)
    assert not any(p.get("stream") for p in payloads["dynamic"])
    assert sum(bool(p.get("stream")) for p in payloads["rolling_paged"]) > 4

    dynamic = json.loads((out / "dynamic" / "32x128" / "report.json").read_text())
    rolling = json.loads((out / "rolling_paged" / "256x32" / "report.json").read_text())
    assert dynamic["stream"] is False and dynamic["steps"][1]["ttft_s"] is None
    # The settings' LMI (0.36.0-lmi27, vLLM) answers "details": true: rolling answers carry LMI's own count;
    # dynamic batching cannot, and without --tokenizer its figure is a lower bound (never one per line).
    assert rolling["stream"] is True and rolling["unit"] == "tokens" and not rolling["output_lower_bound"]
    assert set(rolling["token_methods"]) == {"details"}
    assert sum(p.get("parameters", {}).get("details") is True for p in payloads["rolling_paged"]) > 4
    assert not any(p.get("parameters", {}).get("details") for p in payloads["dynamic"])
    assert dynamic["output_lower_bound"] and set(dynamic["token_methods"]) == {"words"}
    assert all(step["ttft_s"]["p50"] > 0 and step["output_total"] == 32 * step["ok"] for step in rolling["steps"])
    for mode in ("dynamic", "rolling_paged"):
        for shape in ("32x128", "256x32"):
            assert {p.name for p in (out / mode / shape).iterdir()} >= {"report.json", "report.csv", "report.png"}

    compared = json.loads((out / "compare.json").read_text())
    rows = {(row["mode"], row["shape"]): row for row in compared["rows"]}
    assert rows[("rolling_paged", "32x128")]["published_tokens_per_s"] == 59.18
    assert rows[("dynamic", "256x32")]["published_p90_s"] == 59.31
    paged = rows[("rolling_paged", "32x128")]
    assert paged["top_concurrency"] == 4 and paged["status"] == "ok"
    assert rows[("rolling_paged", "32x128")]["vs_published"] > 0  # LMI's exact count: beside the recipe's tokens
    assert rows[("dynamic", "32x128")]["vs_published"] is None  # a lower bound: not put beside tokens
    assert rows[("dynamic", "32x128")]["unit"] == "tokens, lower bound"
    assert compared["endpoint_hours"] > 0 and compared["cost_usd"] >= 0
    assert (out / "compare.png").stat().st_size > 0 and (out / "compare.csv").read_text().startswith("mode,shape")
    assert "recipe tok/s" in printed and "continuous + PagedAttention" in printed
    # The endpoint's instance, and the network this run creates (NAT gateway, interface endpoints).
    assert "1 x ml.g5.48xlarge at $20.360/h" in printed and "1 x nat-gateway" in printed
    assert "x interface-endpoint at $0.010/h" in printed
    assert "cost of this run: about $" in printed


def run_with_stub_loadtest(cdk_runner, aws, tmp_path, argv=(), loadtest_status=0, **options):
    seen: list[list[str]] = []

    def fake_loadtest(args):
        seen.append(args)
        folder = Path(args[args.index("--out") + 1])
        folder.mkdir(parents=True, exist_ok=True)
        step = {"concurrency": 1, "requests": 2, "ok": 2, "error_rate": 0.0, "output_per_s": 10.0,
                "latency_s": {"p90": 1.0}, "ttft_s": None, "itl_s": None, "client_output_per_s": None}
        (folder / "report.json").write_text(json.dumps({"steps": [step], "unit": "tokens", "passed": True,
                                                         "interrupted": loadtest_status == 130}))
        return loadtest_status

    status = cli.main(["--env", "dev", "--modes", "rolling,rolling_paged", "--shapes", "32x128",
                       "--out", str(tmp_path / "run"), "--poll-seconds", "0.01", *argv],
                      account=aws.account, runner=cdk_runner, loadtest=fake_loadtest, **quiet(**options))
    return status, seen


class WarmRuntime:
    def invoke_endpoint(self, **_):
        import io

        from botocore.response import StreamingBody

        data = b'{"generated_text": "waves"}'
        return {"Body": StreamingBody(io.BytesIO(data), len(data))}


def test_a_failed_deploy_still_destroys_what_the_run_created_and_keeps_what_existed(fake_aws, cdk, tmp_path,
                                                                                    monkeypatch, capsys):
    runner, calls = cdk
    monkeypatch.setenv("FAKE_CDK_FAIL", "deploy:rolling_paged")
    aws = Aws(runtime=WarmRuntime(), existing={f"{PREFIX}-artifacts", f"{PREFIX}-network"})
    status, seen = run_with_stub_loadtest(runner, aws, tmp_path)
    assert status == 1 and len(seen) == 1
    assert [(v, s) for v, s, _ in calls() if v != "synth"] == [
        ("deploy", f"{PREFIX}-falcon"), ("deploy", f"{PREFIX}-falcon"), ("destroy", f"{PREFIX}-falcon")]
    printed = capsys.readouterr().out
    assert "deploy falcon.batching=rolling_paged: FAILED" in printed and "rolling" in printed


def test_ctrl_c_during_a_load_step_tears_down_and_exits_130(fake_aws, cdk, tmp_path):
    runner, calls = cdk
    status, seen = run_with_stub_loadtest(runner, Aws(runtime=WarmRuntime()), tmp_path, loadtest_status=130)
    assert status == 130 and len(seen) == 1
    assert [s for v, s, _ in calls() if v == "destroy"] == [f"{PREFIX}-falcon", f"{PREFIX}-network",
                                                             f"{PREFIX}-artifacts"]


def test_an_unfinished_teardown_exits_4_and_prints_what_to_run(fake_aws, cdk, tmp_path, monkeypatch, capsys):
    runner, _calls = cdk
    monkeypatch.setenv("FAKE_CDK_FAIL", f"destroy:{PREFIX}-falcon")
    status, _ = run_with_stub_loadtest(runner, Aws(runtime=WarmRuntime(), statuses=("InService",) * 2), tmp_path)
    printed = capsys.readouterr().out
    assert status == 4 and "TEARDOWN INCOMPLETE" in printed
    assert f"destroy --force --exclusively -c env=dev -c falcon.enabled=true -c falcon.batching=rolling_paged " \
           f"{PREFIX}-falcon" in printed


def test_a_failed_endpoint_stops_the_run_and_tears_down(fake_aws, cdk, tmp_path, capsys):
    runner, calls = cdk
    status, seen = run_with_stub_loadtest(runner, Aws(runtime=WarmRuntime(), statuses=("Failed",)), tmp_path)
    assert status == 1 and not seen
    assert "CUDA out of memory" in capsys.readouterr().out
    assert next(s for v, s, _ in calls() if v == "destroy") == f"{PREFIX}-falcon"


def test_error_rate_over_the_limit_finishes_every_mode_then_exits_1(fake_aws, cdk, tmp_path):
    runner, _calls = cdk
    status, seen = run_with_stub_loadtest(runner, Aws(runtime=WarmRuntime(), statuses=("InService",) * 2), tmp_path,
                                          loadtest_status=1)
    assert status == 1 and len(seen) == 2 and (tmp_path / "run" / "compare.json").exists()


def test_keep_leaves_the_stacks_up(fake_aws, cdk, tmp_path, capsys):
    runner, calls = cdk
    status, _ = run_with_stub_loadtest(runner, Aws(runtime=WarmRuntime(), statuses=("InService",) * 2), tmp_path,
                                       argv=["--keep"])
    assert status == 0 and not [v for v, _, _ in calls() if v == "destroy"]
    assert "teardown skipped (--keep)" in capsys.readouterr().out


@pytest.mark.parametrize(("existing", "quota", "argv", "expected"), [
    ({f"{PREFIX}-falcon"}, 2.0, [], "already exists"),
    (set(), 0.0, [], "quota 'ml.g5.48xlarge for endpoint usage' is 0"),
    ({f"{PREFIX}-falcon"}, 1.0, ["--reuse-existing"], "must be at least 2, it is 1"),
])
def test_preconditions_stop_before_anything_is_deployed(fake_aws, cdk, tmp_path, capsys, existing, quota, argv,
                                                       expected):
    runner, calls = cdk
    status, seen = run_with_stub_loadtest(runner, Aws(existing=existing, quota=quota), tmp_path, argv=argv)
    assert status == 3 and not seen and {v for v, _, _ in calls()} == {"synth"}
    assert expected in capsys.readouterr().out


def test_reuse_existing_updates_the_falcon_stack_but_never_destroys_it(fake_aws, cdk, tmp_path, capsys):
    runner, calls = cdk
    aws = Aws(runtime=WarmRuntime(), existing={f"{PREFIX}-artifacts", f"{PREFIX}-network", f"{PREFIX}-falcon"},
              quota=2.0, statuses=("InService",) * 2)
    status, _ = run_with_stub_loadtest(runner, aws, tmp_path, argv=["--reuse-existing"])
    assert status == 0 and not [v for v, _, _ in calls() if v == "destroy"]
    assert "existed before the run and stays up, now with falcon.batching=rolling_paged" in capsys.readouterr().out


def test_dry_run_checks_and_prices_without_deploying(fake_aws, cdk, tmp_path, capsys):
    runner, calls = cdk
    status, seen = run_with_stub_loadtest(runner, Aws(), tmp_path, argv=["--dry-run"])
    assert status == 0 and not seen and {v for v, _, _ in calls()} == {"synth"}
    printed = capsys.readouterr().out
    assert "per hour while the endpoint is up" in printed and "dry run: nothing deployed" in printed


def test_usage_errors_and_a_mode_that_does_not_synthesize(fake_aws, cdk, tmp_path, monkeypatch, capsys):
    runner, _ = cdk
    assert cli.main(["--modes", "static"], runner=runner) == 2
    assert cli.main(["--shapes", "32by128"], runner=runner) == 2
    assert cli.main(["-c", "falcon.tensor_parallel_degree=three"], runner=runner) == 2
    assert "falcon.tensor_parallel_degree" in capsys.readouterr().err
    monkeypatch.setenv("FAKE_CDK_FAIL", "synth:dynamic")
    assert cli.main(["--modes", "rolling,dynamic", "--out", str(tmp_path)], runner=runner) == 3


def test_help_documents_the_run_both_ways():
    help_text = cli.build_parser().format_help()
    for words in ("make falcon-benchmark", "ARGS=--help", "Exit status", "tears down", "$20/h", "--keep"):
        assert words in help_text or words in cli.DESCRIPTION + cli.EPILOG
    done = subprocess.run([sys.executable, "-m", "inference.llm.falcon_benchmark", "--help"], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0 and "InService" in done.stdout


@pytest.mark.parametrize(("variables", "expected"), [
    (["HELP=1"], "-m inference.llm.falcon_benchmark --help"),
    (["ARGS=--help"], "-m inference.llm.falcon_benchmark --env dev --help"),
    (["ENV=staging", "MODES=dynamic,rolling_paged", "SHAPES=32x128"],
     "-m inference.llm.falcon_benchmark --env staging --modes dynamic,rolling_paged --shapes 32x128"),
])
def test_make_target_passes_its_variables(variables, expected):
    root = Path(__file__).resolve().parents[2]
    # Under `make test` the child make inherits MAKELEVEL and would print "Entering/Leaving directory" lines.
    done = subprocess.run(["make", "--no-print-directory", "-n", "falcon-benchmark", *variables], cwd=root,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0 and expected in " ".join(done.stdout.splitlines()[-1].split())


def test_sigterm_tears_down_like_ctrl_c(fake_aws, cdk, tmp_path):
    import os
    import signal

    runner, calls = cdk

    def terminated(_args):
        os.kill(os.getpid(), signal.SIGTERM)  # as `kill` or a cancelled CI job would
        return 0

    before = signal.getsignal(signal.SIGTERM)
    status = cli.main(["--modes", "rolling", "--shapes", "32x128", "--out", str(tmp_path), "--poll-seconds", "0.01"],
                      account=Aws(runtime=WarmRuntime()).account, runner=runner, loadtest=terminated, **quiet())
    assert status == 130 and [s for v, s, _ in calls() if v == "destroy"][:1] == [f"{PREFIX}-falcon"]
    assert signal.getsignal(signal.SIGTERM) is before  # restored afterwards


class ImpatientRunner(CdkRunner):
    """A second Ctrl-C arrives while the first stack is being destroyed."""

    def destroy(self, stack, context):
        raise KeyboardInterrupt


def test_a_second_ctrl_c_during_teardown_lists_every_stack_left(fake_aws, cdk, tmp_path, capsys):
    runner, _ = cdk
    status, _ = run_with_stub_loadtest(ImpatientRunner(command=runner.command), Aws(runtime=WarmRuntime()), tmp_path,
                                       loadtest_status=130)
    printed = capsys.readouterr().out
    assert status == 4 and "TEARDOWN INCOMPLETE" in printed
    left = [line for line in printed.splitlines() if "destroy --force --exclusively" in line]
    assert [line.rsplit(" ", 1)[-1] for line in left] == [f"{PREFIX}-falcon", f"{PREFIX}-network",
                                                          f"{PREFIX}-artifacts"]


@pytest.mark.parametrize(("argv", "modes"), [
    ([], ["dynamic", "rolling_paged"]),  # LMI 0.33 (the default) always pages: no plain `rolling`
    (["-c", "falcon.lmi_version=0.23.0"], ["dynamic", "rolling", "rolling_paged"]),
])
def test_default_modes_are_those_the_container_offers(fake_aws, cdk, tmp_path, argv, modes):
    runner, calls = cdk
    status = cli.main(["--dry-run", "--out", str(tmp_path), *argv], account=Aws().account, runner=runner,
                      loadtest=lambda _args: 0, **quiet())
    assert status == 0 and [context["falcon.batching"] for _, _, context in calls()] == modes


def test_an_unexpected_aws_error_and_an_unusable_endpoint_still_tear_down(fake_aws, cdk, tmp_path, capsys):
    runner, calls = cdk
    aws = Aws(runtime=WarmRuntime(), statuses=())
    aws.stubbers["sagemaker"].add_client_error("describe_endpoint", "AccessDeniedException", "not allowed")
    status, _ = run_with_stub_loadtest(runner, aws, tmp_path)
    assert status == 1 and "unexpected ClientError" in capsys.readouterr().out
    assert f"{PREFIX}-falcon" in [s for v, s, _ in calls() if v == "destroy"]

    status, seen = run_with_stub_loadtest(runner, Aws(runtime=WarmRuntime()), tmp_path, loadtest_status=3)
    assert status == 1 and len(seen) == 1 and "ended with status 3" in capsys.readouterr().out


def test_without_quota_for_two_fleets_each_mode_gets_a_fresh_endpoint(fake_aws, cdk, tmp_path, capsys):
    runner, calls = cdk
    status, seen = run_with_stub_loadtest(runner, Aws(runtime=WarmRuntime(), quota=1.0, statuses=("InService",) * 2),
                                          tmp_path)
    assert status == 0 and len(seen) == 2
    assert [(v, s, c["falcon.batching"]) for v, s, c in calls() if v != "synth"] == [
        ("deploy", f"{PREFIX}-falcon", "rolling"), ("destroy", f"{PREFIX}-falcon", "rolling"),
        ("deploy", f"{PREFIX}-falcon", "rolling_paged"), ("destroy", f"{PREFIX}-falcon", "rolling_paged"),
        ("destroy", f"{PREFIX}-network", "rolling_paged"), ("destroy", f"{PREFIX}-artifacts", "rolling_paged")]
    assert "an update in place would need quota for 2 x ml.g5.48xlarge" in capsys.readouterr().out
