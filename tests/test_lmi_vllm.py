"""vLLM's own rules per image, the vLLM pass-through, prefix caching, concurrency, gated models, any decoder model.

The vLLM facts come from vLLM's sdists (inference/llm/lmi/vllm_engine_args.py, generated); the literals asserted
here were read in those sources by hand (file and line in each test), so a wrong generator shows up. How the
options reach vLLM goes through tests/lmi_container.py, DJL's code per branch.
"""

from __future__ import annotations

import dataclasses
import io
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from inference.llm import lmi
from inference.llm.lmi import vllm_args_gen
from inference.llm.lmi.cli import main
from inference.llm.lmi.models import from_config, from_config_file
from inference.llm.lmi.vllm import VllmStartError, start_checks
from inference.llm.lmi.vllm_engine_args import VLLM_SOURCES
from settings import SettingsError, load_settings
from settings.serving import FalconSettings
from tests.lmi_container import BRANCH_VLLM, FALCON_HUB_CONFIG, start, vllm_engine_arguments

CONFIGS = Path(__file__).parent / "lmi_model_configs"
REVISION = "0123456789abcdef0123456789abcdef01234567"
DEFAULT = FalconSettings(model_revision=REVISION)
HUB = {"tiiuae/falcon-40b": FALCON_HUB_CONFIG}


def falcon(**changes) -> FalconSettings:
    return dataclasses.replace(DEFAULT, **changes)


def refused(rule, settings: FalconSettings, key: str, *fragments: str) -> SettingsError:
    with pytest.raises(SettingsError) as caught:
        rule(settings)
    assert caught.value.key == key, str(caught.value)
    for fragment in fragments:
        assert fragment in str(caught.value), str(caught.value)
    return caught.value


# --- the generated table, against facts read by hand ---------------------------------------------------

def test_the_table_holds_each_bundled_vllm_read_from_its_sdist():
    assert list(VLLM_SOURCES) == ["0.8.4", "0.11.1", "0.23.0", "0.26.0", "0.28.0"]
    for version, record in VLLM_SOURCES.items():
        assert record["sdist"] == f"vllm-{version}.tar.gz" and len(record["sha256"]) == 64
        # every option render() writes for vLLM exists, with the kind DJL's string values must parse as
        kinds = {name: record["engine_args"][name] for name in (
            "max_model_len", "gpu_memory_utilization", "enable_chunked_prefill", "enable_prefix_caching",
            "max_num_batched_tokens", "max_num_seqs", "tensor_parallel_size")}
        assert kinds == {"max_model_len": "int", "gpu_memory_utilization": "float", "enable_chunked_prefill": "bool",
                         "enable_prefix_caching": "bool", "max_num_batched_tokens": "int", "max_num_seqs": "int",
                         "tensor_parallel_size": "int"}, version


def test_facts_read_by_hand_in_the_sdists():
    # 0.8.4 vllm/engine/arg_utils.py: three add_argument(..., action=StoreBoolean) calls; use_v2_block_manager is
    # still an EngineArgs field (DJL 0.33 passes it); vllm/config.py:1307 `if self.gpu_memory_utilization > 1.0`.
    old = VLLM_SOURCES["0.8.4"]
    assert old["store_boolean"] == ["disable_chunked_mm_input", "enable_chunked_prefill", "multi_step_stream_outputs"]
    assert "use_v2_block_manager" in old["engine_args"]
    assert old["gpu_memory_utilization"] == {"source": "vllm/config.py:1307", "greater_than": None, "at_most": 1.0}
    assert old["float16_refused_model_types"] == []
    # 0.23.0 vllm/config/cache.py:67 `gpu_memory_utilization: float = Field(default=0.92, gt=0, le=1)`;
    # vllm/config/model.py _FLOAT16_NOT_SUPPORTED_MODELS; scheduler.py verify_max_model_len.
    lmi27 = VLLM_SOURCES["0.23.0"]
    assert lmi27["gpu_memory_utilization"] == {"source": "vllm/config/cache.py:67", "greater_than": 0, "at_most": 1.0}
    assert lmi27["float16_refused_model_types"] == ["gemma2", "gemma3", "gemma3_text", "glm4", "plamo2"]
    assert lmi27["checks"]["prefill_vs_max_model_len"].startswith("vllm/config/scheduler.py:")
    assert "use_v2_block_manager" not in lmi27["engine_args"] and "runner" in lmi27["engine_args"]
    assert VLLM_SOURCES["0.28.0"]["float16_refused_model_types"] == ["gemma2", "gemma3", "gemma3_text", "glm4"]


def _sdist(tmp_path: Path, version: str, files: dict[str, str]) -> Path:
    path = tmp_path / f"vllm-{version}.tar.gz"
    with tarfile.open(path, "w:gz") as archive:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"vllm-{version}/{name}")
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return path


TINY_ARG_UTILS = '''
from dataclasses import dataclass
from typing import Literal, Optional
@dataclass
class EngineArgs:
    max_model_len: Optional[int] = None
    enforce_eager: bool = False
    kv_cache_dtype: Literal["auto", "fp8"] = "auto"
    swap_space: float = 4
    @staticmethod
    def add_cli_args(parser):
        parser.add_argument("--enable-chunked-prefill", action=StoreBoolean, default=None)
        parser.add_argument("--enforce-eager", action="store_true")
class AsyncEngineArgs(EngineArgs):
    disable_log_requests: bool = False
'''
TINY_CONFIG = '''
class CacheConfig:
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1)
def checks(self):
    raise ValueError("x is smaller than max_model_len")
    raise ValueError("must be greater than or equal to max_num_seqs")
    raise ValueError("must be divisible by tensor parallel size")
    raise ValueError("User-specified max_model_len")
    raise ValueError("Unknown dtype")
_FLOAT16_NOT_SUPPORTED_MODELS = {"gemma2": "why"}
'''


def test_the_generator_reads_engine_args_bounds_and_checks_from_an_sdist(tmp_path, capsys):
    path = _sdist(tmp_path, "9.9.9", {"vllm/engine/arg_utils.py": TINY_ARG_UTILS,
                                      "vllm/config/cache.py": TINY_CONFIG,
                                      "vllm/model_executor/layers/linear.py": "num_kv_head_replicas = divide(a, b)\n"})
    assert vllm_args_gen.main([str(path)]) == 0
    namespace: dict = {}
    exec(capsys.readouterr().out, namespace)
    record = namespace["VLLM_SOURCES"]["9.9.9"]
    # EngineArgs' own fields only (AsyncEngineArgs' are not in EngineArgs.__annotations__, DJL's filter)
    assert record["engine_args"] == {"enforce_eager": "bool", "kv_cache_dtype": "literal", "max_model_len": "int",
                                     "swap_space": "float"}
    assert record["store_boolean"] == ["enable_chunked_prefill"]
    assert record["gpu_memory_utilization"] == {"source": "vllm/config/cache.py:3", "greater_than": 0, "at_most": 1}
    assert record["float16_refused_model_types"] == ["gemma2"]
    assert record["checks"]["prefill_vs_max_model_len"] == "vllm/config/cache.py:5"
    assert record["checks"]["kv_heads_vs_tensor_parallel"] == "vllm/model_executor/layers/linear.py:1"


def test_the_generator_fails_on_an_sdist_without_engine_args(tmp_path, capsys):
    path = _sdist(tmp_path, "9.9.9", {"vllm/config.py": TINY_CONFIG})
    assert vllm_args_gen.main([str(path)]) == 1
    assert "no vllm/engine/arg_utils.py" in capsys.readouterr().err
    assert vllm_args_gen.main([str(tmp_path / "not-an-sdist.zip")]) == 1


# --- vLLM's start-up checks -----------------------------------------------------------------------------

FALCON_40B = lmi.CATALOGUE["tiiuae/falcon-40b"]
GOOD = {"max_model_len": "1280", "max_num_seqs": "32", "max_num_batched_tokens": "1024",
        "enable_chunked_prefill": "true", "gpu_memory_utilization": "0.9", "tensor_parallel_size": "8",
        "dtype": "float16"}


@pytest.mark.parametrize("version", list(VLLM_SOURCES))
def test_vllm_start_checks_pass_and_fail_with_vllms_file_and_line(version):
    start_checks(version, GOOD, FALCON_40B)
    failing = {
        "max_num_batched_tokens": {**GOOD, "enable_chunked_prefill": "false"},  # scheduler: < max_model_len
        "gpu_memory_utilization": {**GOOD, "gpu_memory_utilization": "1.2"},
        "tensor_parallel_size": {**GOOD, "tensor_parallel_size": "3"},  # 128 heads
        "dtype": {**GOOD, "dtype": "fp8"},
        "max_model_len": {**GOOD, "max_model_len": "4096"},  # Falcon's 2048 positions
    }
    for argument, arguments in failing.items():
        with pytest.raises(VllmStartError) as caught:
            start_checks(version, arguments, FALCON_40B)
        assert caught.value.argument == argument
        assert f"vLLM {version} vllm/" in str(caught.value)
    with pytest.raises(VllmStartError, match="at least max_num_seqs"):
        start_checks(version, {**GOOD, "max_num_seqs": "2048"}, FALCON_40B)


def test_kv_heads_must_split_or_replicate_whole():
    six_kv = dataclasses.replace(FALCON_40B, attention_heads=24, kv_heads=6)
    start_checks("0.23.0", {**GOOD, "tensor_parallel_size": "2"}, six_kv)
    with pytest.raises(VllmStartError, match="KV heads") as caught:
        start_checks("0.23.0", {**GOOD, "tensor_parallel_size": "4"}, six_kv)
    assert "model_executor/layers/linear.py" in str(caught.value)


def test_float16_refused_for_gemma3_where_vllm_refuses_it():
    gemma = from_config_file(str(CONFIGS / "gemma3.json"))
    start_checks("0.8.4", {**GOOD, "tensor_parallel_size": "1", "max_model_len": "2048"}, gemma)  # not yet there
    with pytest.raises(VllmStartError, match="refuses float16 for model type gemma3_text"):
        start_checks("0.23.0", {**GOOD, "tensor_parallel_size": "1", "max_model_len": "2048"}, gemma)
    setting = falcon(model_config=str(CONFIGS / "gemma3.json"), model_id="google/gemma-3-4b-it",
                     instance_type="ml.g5.2xlarge", tensor_parallel_degree=1)
    refused(lmi.check, setting, "falcon.dtype", "vLLM 0.23.0", "gemma3_text")
    lmi.check(dataclasses.replace(setting, dtype="bf16"))


def test_the_settings_rules_name_the_setting_behind_the_engine_argument():
    refused(lmi.check, falcon(max_rolling_batch_size=256, max_rolling_batch_prefill_tokens=128),
            "falcon.max_rolling_batch_prefill_tokens", "at least max_num_seqs (256)", "vllm/config/scheduler.py")
    refused(lmi.check, falcon(max_input_tokens=2000, max_new_tokens=100, max_rolling_batch_prefill_tokens=4096),
            "falcon.max_new_tokens", "the 2048 positions of tiiuae/falcon-40b")
    lmi.check(falcon(lmi_version="0.23.0", max_rolling_batch_size=256, max_rolling_batch_prefill_tokens=1024))


# --- falcon.vllm_args ----------------------------------------------------------------------------------

def test_vllm_args_render_as_options_and_environment():
    settings = falcon(vllm_args=("enforce_eager=true", "max_num_partial_prefills=2", "kv_cache_dtype=fp8"))
    assert lmi.check(settings) == []
    props = lmi.render(settings)
    assert (props["option.enforce_eager"], props["option.kv_cache_dtype"]) == ("true", "fp8")
    environment = lmi.to_environment(settings)
    assert (environment["OPTION_ENFORCE_EAGER"], environment["OPTION_MAX_NUM_PARTIAL_PREFILLS"]) == ("true", "2")


def test_an_unknown_vllm_argument_is_refused_with_the_nearest_names():
    error = refused(lmi.check, falcon(vllm_args=("enforce_eagr=true",)), "falcon.vllm_args",
                    "an engine argument of vLLM 0.23.0", "nearest: enforce_eager")
    assert error.value == "enforce_eagr=true"
    # an argument that exists in a later vLLM only (0.8.4 still had use_v2_block_manager; 0.23.0 does not)
    lmi.check(falcon(lmi_version="0.33.0", vllm_args=("use_v2_block_manager=true",)))
    refused(lmi.check, falcon(vllm_args=("use_v2_block_manager=true",)), "falcon.vllm_args", "vLLM 0.23.0")


def test_vllm_args_syntax_types_and_managed_names():
    refused(lmi.check, falcon(vllm_args=("enforce-eager=true",)), "falcon.vllm_args", "enforce_eager")
    refused(lmi.check, falcon(vllm_args=("enforce_eager",)), "falcon.vllm_args", "name=value")
    refused(lmi.check, falcon(vllm_args=("enforce_eager=yes",)), "falcon.vllm_args", "true or false")
    refused(lmi.check, falcon(vllm_args=("max_num_partial_prefills=two",)), "falcon.vllm_args", "an integer")
    refused(lmi.check, falcon(vllm_args=("mm_processor_cache_gb=lots",)), "falcon.vllm_args", "a number")
    refused(lmi.check, falcon(vllm_args=("kv_cache_dtype=true",)), "falcon.vllm_args", "bare flag")
    refused(lmi.check, falcon(vllm_args=("max_num_seqs=64",)), "falcon.vllm_args", "falcon.max_rolling_batch_size")
    refused(lmi.check, falcon(vllm_args=("enforce_eager=true", "enforce_eager=false")), "falcon.vllm_args", "twice")
    refused(lmi.check, falcon(lmi_version="0.23.0", vllm_args=("enforce_eager=true",)), "falcon.vllm_args",
            "lmi-dist serves it")


def test_a_false_flag_only_where_djl_passes_it_on():
    """construct_vllm_args_list: 0.35.0-dlc drops false, 0.33.0-dlc keeps it for StoreBoolean flags only."""
    lmi.check(falcon(vllm_args=("enforce_eager=false",)))  # lmi27: --no-enforce-eager
    refused(lmi.check, falcon(lmi_version="0.35.0", vllm_args=("enforce_eager=false",)), "falcon.vllm_args",
            "drops option.enforce_eager=false")
    lmi.check(falcon(lmi_version="0.33.0", vllm_args=("disable_chunked_mm_input=false",)))  # StoreBoolean in 0.8.4
    refused(lmi.check, falcon(lmi_version="0.33.0", vllm_args=("enforce_eager=false",)), "falcon.vllm_args",
            "StoreBoolean")


@pytest.mark.parametrize("version", ["0.33.0", "0.35.0", "0.36.0-lmi27"])
def test_vllm_args_and_prefix_caching_reach_vllm_through_djls_code(version):
    """Through tests/lmi_container.py (DJL's vllm_rb_properties.py at the branch): what we render arrives."""
    settings = falcon(lmi_version=version, enable_prefix_caching=True, vllm_args=("enforce_eager=true",))
    lmi.check(settings)
    (model,) = start(version, lmi.to_environment(settings), {}, HUB).models
    record = VLLM_SOURCES[BRANCH_VLLM[version]]
    arguments = vllm_engine_arguments(model, record["engine_args"], record["store_boolean"])
    assert (arguments["enable_prefix_caching"], arguments["enforce_eager"]) == ("true", "true")
    # a name outside EngineArgs is dropped by DJL: the reason check_vllm_args refuses it at synth
    (model,) = start(version, {**lmi.to_environment(settings), "OPTION_ENFORCE_EAGR": "true"}, {}, HUB).models
    assert "enforce_eagr" not in vllm_engine_arguments(model, record["engine_args"], record["store_boolean"])


# --- prefix caching, concurrency ----------------------------------------------------------------------------

def test_prefix_caching_renders_on_vllm_only():
    assert lmi.render(falcon(enable_prefix_caching=True))["option.enable_prefix_caching"] == "true"
    assert "option.enable_prefix_caching" not in lmi.render(falcon())  # vLLM's default (on in its V1 engine)
    refused(lmi.check, falcon(lmi_version="0.23.0", enable_prefix_caching=True), "falcon.enable_prefix_caching",
            "lmi-dist")
    refused(lmi.check, falcon(batching="dynamic", enable_prefix_caching=True), "falcon.enable_prefix_caching",
            "accelerate")


def test_prefix_caching_off_only_where_false_reaches_vllm():
    settings = falcon(enable_prefix_caching=False)
    lmi.check(settings)
    (model,) = start("0.36.0-lmi27", lmi.to_environment(settings), {}, HUB).models
    record = VLLM_SOURCES["0.23.0"]
    assert vllm_engine_arguments(model, record["engine_args"])["enable_prefix_caching"] == "false"  # --no-...
    for version in ("0.33.0", "0.35.0"):
        refused(lmi.check, falcon(lmi_version=version, enable_prefix_caching=False), "falcon.enable_prefix_caching",
                "drops option.enable_prefix_caching=false")


def test_max_concurrent_requests_is_lmis_job_queue_size():
    settings = falcon(max_concurrent_requests=64)
    lmi.check(settings)
    assert lmi.render(settings)["job_queue_size"] == "64"
    assert lmi.to_environment(settings)["SERVING_JOB_QUEUE_SIZE"] == "64"
    assert "job_queue_size" not in lmi.render(falcon())  # LMI's default, 1000
    refused(lmi.check, falcon(max_concurrent_requests=16), "falcon.max_concurrent_requests",
            "at least falcon.max_rolling_batch_size (32)")
    refused(lmi.check, falcon(batching="dynamic", max_concurrent_requests=2), "falcon.max_concurrent_requests",
            "at least falcon.batch_size (4)")


# --- gated models ---------------------------------------------------------------------------------------

def test_the_hf_token_is_for_hub_downloads_on_releases_that_mask_it():
    lmi.check(falcon(hf_token_secret="prod/hf-token"))
    refused(lmi.check, falcon(hf_token_secret="prod/hf-token", model_s3_uri="s3://bucket/model/", model_revision=None),
            "falcon.hf_token_secret", "never asks the hub")
    refused(lmi.check, falcon(hf_token_secret="prod/hf-token", lmi_version="0.23.0"), "falcon.hf_token_secret",
            "logs HF_TOKEN in plain text")
    with pytest.raises(SettingsError, match="secret name or ARN"):
        load_settings("dev", {"falcon.hf_token_secret": "has spaces"})


# --- any decoder model -----------------------------------------------------------------------------------

@pytest.mark.parametrize(("name", "expected", "billion"), [
    ("llama.json", (32, 32, 8, 128, "llama", None), 8.03),  # rope scaling extends 131072: no positions check
    ("mistral.json", (32, 32, 8, 128, "mistral", 32768), 7.25),
    ("qwen2.json", (28, 28, 4, 128, "qwen2", 32768), 7.62),
])
def test_architecture_from_config_json(name, expected, billion):
    arch = from_config_file(str(CONFIGS / name))
    assert (arch.layers, arch.attention_heads, arch.kv_heads, arch.head_dim, arch.model_type,
            arch.max_position_embeddings) == expected
    assert arch.parameters_billion == pytest.approx(billion, rel=0.01)  # the published parameter counts


def test_falcon_configs_in_both_of_their_forms():
    forty = from_config({"model_type": "falcon", "new_decoder_architecture": True, "hidden_size": 8192,
                         "num_attention_heads": 128, "num_kv_heads": 8, "num_hidden_layers": 60, "vocab_size": 65024})
    assert (forty.kv_heads, forty.head_dim) == (8, 64)
    assert forty.parameters_billion == pytest.approx(41.3, rel=0.01)  # lm_head tied to the embeddings
    seven = from_config({"model_type": "falcon", "multi_query": True, "hidden_size": 4544, "n_head": 71,
                         "n_layer": 32, "vocab_size": 65024})
    assert (seven.attention_heads, seven.kv_heads) == (71, 1)
    with pytest.raises(SettingsError, match="num_hidden_layers"):
        from_config({"model_type": "t5"})


@pytest.mark.parametrize("name", ["llama.json", "mistral.json", "qwen2.json", "gemma3.json"])
def test_cli_sizing_reads_a_model_config(name, capsys):
    path = str(CONFIGS / name)
    assert main(["sizing", "--model-config", path, "--model-id", f"example/{name[:-5]}",
                 "--instance-type", "ml.g5.2xlarge", "--tensor-parallel-degree", "1", "--dtype", "bf16",
                 "--max-rolling-batch-size", "8"]) == 0
    captured = capsys.readouterr()
    assert f"example/{name[:-5]} (architecture of {path}) bf16 on ml.g5.2xlarge" in captured.out
    assert "largest batch" in captured.out
    assert "is a falcon model" not in captured.err  # model_id is not a catalogue model: nothing to disagree with
    assert main(["render", "--model-config", path, "--model-id", f"example/{name[:-5]}",
                 "--instance-type", "ml.g5.48xlarge", "--tensor-parallel-degree", "4", "--dtype", "bf16"]) == 0


def test_cli_sizing_with_only_a_config_file_warns_that_model_id_is_another_model(capsys):
    """The issue's form, `sizing --model-config config.json`: sized from the file; the default model_id (Falcon)
    would be what deploys, so it says so."""
    path = str(CONFIGS / "llama.json")
    assert main(["sizing", "--model-config", path]) == 0
    captured = capsys.readouterr()
    assert f"tiiuae/falcon-40b (architecture of {path}) fp16" in captured.out
    assert "KV cache  131,072 bytes per token" in captured.out  # Llama 3 8B: 2 x 32 layers x 8 KV heads x 128 x 2
    assert ("warning: falcon.model_config is a llama config.json, but falcon.model_id tiiuae/falcon-40b is a "
            "falcon model") in captured.err


def test_cli_refuses_a_tensor_parallel_degree_the_model_cannot_split(capsys):
    assert main(["sizing", "--model-config", str(CONFIGS / "qwen2.json"), "--model-id", "example/qwen2",
                 "--dtype", "bf16"]) == 1  # 28 heads, TP 8
    assert "a divisor of the 28 attention heads" in capsys.readouterr().err
    assert main(["sizing", "--model-config", str(CONFIGS / "missing.json")]) == 1
    assert "readable config.json" in capsys.readouterr().err


@pytest.mark.parametrize("model_id", [m for m in lmi.MODELS if not m.startswith("tiiuae/")])
def test_catalogue_models_fit_the_smoke_and_prod_instances(model_id):
    assert lmi.MODELS[model_id].licence == "Apache-2.0"
    smoke = load_settings("smoke", {"falcon.model_id": model_id, "falcon.dtype": "bf16",
                                    "falcon.lmi_version": "0.36.0-lmi27"}).falcon
    assert lmi.check(dataclasses.replace(smoke, model_revision=REVISION)) == []
    lmi.check(falcon(model_id=model_id, dtype="bf16"))  # prod: ml.g5.48xlarge, tensor parallel 8
    refused(lmi.check_engine_is_known_on_023, falcon(model_id=model_id, lmi_version="0.23.0"), "falcon.model_id",
            "Falcon")


# --- staging weights in S3 (the production path) ---------------------------------------------------------

def _fake_hub(files: dict[str, bytes], seen: dict):
    """Stands in for huggingface_hub.snapshot_download: writes the files it would fetch, records the call."""
    def download(*, repo_id, revision, local_dir, allow_patterns, token):
        seen.update(repo_id=repo_id, revision=revision, allow_patterns=allow_patterns, token=token)
        for name, data in files.items():
            path = Path(local_dir) / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        (Path(local_dir) / ".cache").mkdir()
        (Path(local_dir) / ".cache" / "lock").write_text("")
        return local_dir
    return download


def test_stage_uploads_a_pinned_revision_with_a_manifest(capsys):
    import hashlib
    import json

    import boto3
    from moto import mock_aws

    from inference.llm.lmi.stage import ALLOW_PATTERNS, stage

    files = {"config.json": b'{"model_type": "qwen3"}', "model-00001-of-00001.safetensors": b"weights",
             "tokenizer.json": b"{}"}
    seen: dict = {}
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="artifacts-bucket")
        uri = stage("Qwen/Qwen3-8B", REVISION, "s3://artifacts-bucket/models/qwen3-8b/", token="hf_secret",
                    download=_fake_hub(files, seen), s3_client=s3, log=lambda line: None)
        keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket="artifacts-bucket")["Contents"])
        manifest = json.loads(s3.get_object(Bucket="artifacts-bucket",
                                            Key=f"models/qwen3-8b/{REVISION}/STAGED.json")["Body"].read())
    assert uri == f"s3://artifacts-bucket/models/qwen3-8b/{REVISION}/"
    assert keys == sorted(f"models/qwen3-8b/{REVISION}/{n}" for n in [*files, "STAGED.json"])  # no .cache
    assert manifest == {"model_id": "Qwen/Qwen3-8B", "revision": REVISION,
                        "files": {n: hashlib.sha256(d).hexdigest() for n, d in files.items()}}
    assert seen["revision"] == REVISION and seen["token"] == "hf_secret" and "*.bin" not in ALLOW_PATTERNS
    # the printed prefix is a valid falcon.model_s3_uri, and that configuration serves with network isolation
    settings = load_settings("prod", {"falcon.model_s3_uri": uri, "falcon.model_id": "Qwen/Qwen3-8B",
                                      "falcon.dtype": "bf16"}).falcon
    assert lmi.check(settings) == [] and lmi.render(settings)["option.model_id"] == "/opt/ml/model"


def test_stage_refuses_a_moving_revision_a_bad_prefix_and_missing_weights(capsys):
    from inference.llm.lmi.stage import StageError, main, stage

    assert main(["--model-id", "m/x", "--revision", "main", "--s3-uri", "s3://artifacts-bucket/m/"]) == 1
    assert "40-character commit hash" in capsys.readouterr().err
    with pytest.raises(StageError, match="ending in /"):
        stage("m/x", REVISION, "s3://artifacts-bucket/m", token=None, s3_client=object())
    with pytest.raises(StageError, match=r"no config\.json and"):
        stage("m/x", REVISION, "s3://artifacts-bucket/m/", token=None, s3_client=object(),
              download=_fake_hub({"config.json": b"{}", "pytorch_model.bin": b"pickle"}, {}), log=lambda line: None)


def test_stage_takes_the_token_from_secrets_manager_and_never_prints_it(capsys, monkeypatch):
    import boto3
    from moto import mock_aws

    from inference.llm.lmi import stage as stage_module

    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    with mock_aws():
        boto3.client("secretsmanager").create_secret(Name="prod/hf-token", SecretString="hf_verysecret")
        assert stage_module.hub_token("prod/hf-token", "us-east-1") == "hf_verysecret"
        with pytest.raises(stage_module.StageError, match="cannot read secret prod/other"):
            stage_module.hub_token("prod/other", "us-east-1")

        def failing(**kwargs):
            raise RuntimeError(f"401 for token {kwargs['token']}")

        monkeypatch.setattr(stage_module, "_snapshot_download", failing)
        boto3.client("s3").create_bucket(Bucket="artifacts-bucket")
        code = stage_module.main(["--model-id", "m/x", "--revision", REVISION, "--s3-uri", "s3://artifacts-bucket/m/",
                                  "--hf-token-secret", "prod/hf-token", "--region", "us-east-1"])
    captured = capsys.readouterr()
    assert code == 1 and "401 for token ***" in captured.err
    assert "hf_verysecret" not in captured.out + captured.err
    assert stage_module.hub_token(None, None, {"HF_TOKEN": "hf_env"}) == "hf_env"


# --- the new settings, as cdk -c and cdk.json give them ------------------------------------------------------

def test_new_settings_parse_from_the_command_line_and_cdk_json():
    from_cli = load_settings("dev", {"falcon.vllm_args": "enforce_eager=true, kv_cache_dtype=fp8",
                                     "falcon.enable_prefix_caching": "false", "falcon.max_concurrent_requests": "64",
                                     "falcon.model_config": "tests/lmi_model_configs/mistral.json"}).falcon
    assert from_cli.vllm_args == ("enforce_eager=true", "kv_cache_dtype=fp8")
    assert (from_cli.enable_prefix_caching, from_cli.max_concurrent_requests) == (False, 64)
    from_json = load_settings("dev", {"falcon.vllm_args": ['speculative_config={"method": "ngram", "n": 4}'],
                                      "falcon.enable_prefix_caching": "none"}).falcon
    assert from_json.vllm_args == ('speculative_config={"method": "ngram", "n": 4}',)  # a list keeps the comma
    assert from_json.enable_prefix_caching is None
    assert FalconSettings().lmi_version == lmi.DEFAULT_VERSION == "0.36.0-lmi27"
    for key, value, allowed in (("falcon.max_concurrent_requests", "0", "from 1"),
                                ("falcon.model_config", "config.yaml", "config.json"),
                                ("falcon.lmi_version", "0.36.0", "0.36.0-lmi27 \\(the image 0.36.0 deployed before")):
        with pytest.raises(SettingsError, match=allowed):
            load_settings("dev", {key: value})


def test_the_issues_command_runs_under_the_former_module_name():
    """`python -m inference.lmi sizing --model-config ...` (issue 22) runs the CLI, which moved to inference.llm."""
    done = subprocess.run([sys.executable, "-m", "inference.lmi", "sizing", "--model-config",
                           str(CONFIGS / "mistral.json")], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stderr
    assert f"(architecture of {CONFIGS / 'mistral.json'})" in done.stdout
