"""inference.llm.lmi: LMI rendering in each era, each rule passing and failing, the recipe's sizing numbers, the CLI.

Pure Python and fast: no aws_cdk, no synth.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from inference.llm import lmi
from inference.llm.lmi.cli import main
from settings import SettingsError, load_settings
from settings.serving import FalconSettings
from tests.conftest import REPO_ROOT

DEFAULT = FalconSettings(model_revision="0123456789abcdef0123456789abcdef01234567")  # pinned: no warning


def falcon(**changes) -> FalconSettings:
    return dataclasses.replace(DEFAULT, **changes)


def parse_properties(text: str) -> dict[str, str]:
    pairs = [line.split("=", 1) for line in text.splitlines() if line.strip() and not line.startswith("#")]
    return {key: value for key, value in pairs}


# --- rendering ---------------------------------------------------------------------------------------
# What the container does with these keys is tested in test_lmi_conformance.py; here, what we write.

COMMON = {"option.model_id": "tiiuae/falcon-40b", "option.revision": DEFAULT.model_revision,
          "option.tensor_parallel_degree": "8", "option.dtype": "fp16", "option.model_loading_timeout": "1800"}


def test_recipe_container_renders_the_recipes_three_configurations():
    """0.23: the recipe's table, with lmi-dist named and MPI started through option.mpi_mode."""
    recipe = {**COMMON, "option.trust_remote_code": "true"}
    rolling = {**recipe, "engine": "MPI", "option.mpi_mode": "true", "option.rolling_batch": "lmi-dist",
               "option.max_rolling_batch_size": "32", "option.max_rolling_batch_prefill_tokens": "1024"}
    assert lmi.render(falcon(lmi_version="0.23.0", batching="dynamic")) == {
        **recipe, "engine": "Python", "option.device_map": "auto", "batch_size": "4", "max_batch_delay": "100"}
    assert lmi.render(falcon(lmi_version="0.23.0", batching="rolling")) == {
        **rolling, "option.paged_attention": "false"}
    assert lmi.render(falcon(lmi_version="0.23.0", batching="rolling_paged")) == {
        **rolling, "option.paged_attention": "true"}


def test_vllm_era_names_its_entry_points():
    modern = {**COMMON, "option.trust_remote_code": "false"}
    assert lmi.render(falcon(batching="dynamic")) == {
        **modern, "engine": "Python", "option.entryPoint": "djl_python.huggingface", "option.rolling_batch": "disable",
        "option.device_map": "auto", "batch_size": "4", "max_batch_delay": "100"}
    assert lmi.render(falcon()) == {
        **modern, "engine": "Python", "option.entryPoint": "djl_python.lmi_vllm.vllm_async_service",
        "option.async_mode": "true", "option.rolling_batch": "vllm", "option.max_rolling_batch_size": "32",
        "option.max_rolling_batch_prefill_tokens": "1024", "option.max_model_len": "1280",
        "option.gpu_memory_utilization": "0.9", "option.enable_chunked_prefill": "true"}


def test_gpu_memory_utilization_is_rendered_for_vllm():
    assert lmi.render(falcon(gpu_memory_utilization=0.85))["option.gpu_memory_utilization"] == "0.85"
    assert "option.gpu_memory_utilization" not in lmi.render(falcon(lmi_version="0.23.0"))


def test_output_formatter_only_when_asked_and_only_for_023_rolling():
    assert "option.output_formatter" not in lmi.render(falcon(lmi_version="0.23.0"))
    props = lmi.render(falcon(lmi_version="0.23.0", output_formatter="jsonlines"))
    assert props["option.output_formatter"] == "jsonlines"


def test_chunked_prefill_only_when_the_prefill_budget_is_below_the_model_length():
    assert "option.enable_chunked_prefill" not in lmi.render(falcon(max_rolling_batch_prefill_tokens=1280))
    assert lmi.render(falcon(max_rolling_batch_prefill_tokens=1279))["option.enable_chunked_prefill"] == "true"


def test_hub_mode_sets_hf_model_id_and_the_pinned_revision():
    pinned = falcon(model_revision="abc123")
    assert lmi.render(pinned)["option.revision"] == "abc123"
    environment = lmi.to_environment(pinned)
    assert environment["HF_MODEL_ID"] == "tiiuae/falcon-40b" and environment["OPTION_REVISION"] == "abc123"
    assert "OPTION_MODEL_ID" not in environment


def test_weights_from_s3_are_served_from_the_model_directory():
    s3 = falcon(model_s3_uri="s3://models-bucket/falcon-40b/")
    assert lmi.render(s3)["option.model_id"] == "/opt/ml/model"
    environment = lmi.to_environment(s3)
    assert environment["OPTION_MODEL_ID"] == "/opt/ml/model" and "HF_MODEL_ID" not in environment


def test_023_environment_has_no_engine_variable():
    """0.23 infers the engine before it reads OPTION_*: MPI comes from OPTION_MPI_MODE instead."""
    environment = lmi.to_environment(falcon(lmi_version="0.23.0"))
    assert "OPTION_ENGINE" not in environment and environment["OPTION_MPI_MODE"] == "true"
    assert lmi.to_environment(falcon())["OPTION_ENGINE"] == "Python"


def test_the_modes_never_mix_their_keys():
    for version in lmi.VERSIONS:
        dynamic = lmi.render(falcon(lmi_version=version, batching="dynamic"))
        assert not any("rolling_batch_size" in k or "prefill" in k or "paged" in k for k in dynamic)
        paged = lmi.render(falcon(lmi_version=version))
        assert "batch_size" not in paged and "max_batch_delay" not in paged


VALID_COMBINATIONS = [(v, b) for v in lmi.VERSIONS for b in ("dynamic", "rolling", "rolling_paged")
                      if b not in lmi.container(v).refused]


@pytest.mark.parametrize(("version", "batching"), VALID_COMBINATIONS)
def test_environment_and_properties_file_carry_the_same_keys(version, batching):
    settings = falcon(lmi_version=version, batching=batching, model_s3_uri="s3://models-bucket/falcon-40b/")
    props = lmi.render(settings)
    from_file = parse_properties(lmi.to_properties_file(props))
    environment = lmi.to_environment(settings)
    assert from_file == props
    for key, value in from_file.items():
        if key == "engine" and version == "0.23.0":
            assert lmi.environment_name(key) not in environment
            continue
        assert environment[lmi.environment_name(key)] == value, key


def test_environment_names_follow_djl_serving():
    assert lmi.environment_name("engine") == "OPTION_ENGINE"
    assert lmi.environment_name("option.max_rolling_batch_size") == "OPTION_MAX_ROLLING_BATCH_SIZE"
    assert lmi.environment_name("option.entryPoint") == "OPTION_ENTRYPOINT"
    assert lmi.environment_name("batch_size") == "SERVING_BATCH_SIZE"
    assert lmi.environment_name("max_batch_delay") == "SERVING_MAX_BATCH_DELAY"


def test_streaming_request_per_version():
    assert json.loads(lmi.streaming_request_body(falcon()))["stream"] is True
    assert "stream" not in json.loads(lmi.streaming_request_body(falcon(lmi_version="0.23.0")))
    assert lmi.streaming_request_body(falcon(batching="dynamic")) is None
    assert json.loads(lmi.request_body(falcon()))["parameters"]["max_new_tokens"] == 128


# --- rules: one passing and one failing case each -------------------------------------------------------

def refused(rule, settings: FalconSettings, key: str, *fragments: str) -> SettingsError:
    with pytest.raises(SettingsError) as caught:
        rule(settings)
    assert caught.value.key == key
    for fragment in fragments:
        assert fragment in str(caught.value), str(caught.value)
    return caught.value


def test_timeouts_within_sagemakers_limits():
    lmi.check_timeouts(falcon(download_timeout_s=60, model_loading_timeout_s=3600))
    # The settings models refuse values outside SageMaker's limits before any rule runs.
    for key, value in (("download_timeout_s", 59), ("startup_health_check_timeout_s", 3601)):
        with pytest.raises(SettingsError, match=rf"falcon.{key}={value}: expected a value from 60 to 3600"):
            load_settings("dev", {f"falcon.{key}": value})


def test_health_check_must_outlast_model_loading():
    lmi.check_health_check_covers_loading(falcon(startup_health_check_timeout_s=1800, model_loading_timeout_s=1800))
    refused(lmi.check_health_check_covers_loading,
            falcon(startup_health_check_timeout_s=900, model_loading_timeout_s=1800),
            "falcon.startup_health_check_timeout_s", "at least falcon.model_loading_timeout_s (1800)")


def test_dynamic_batching_refuses_rolling_keys_and_rolling_refuses_dynamic_keys():
    lmi.check_batching_keys(falcon(batching="dynamic", batch_size=8))
    lmi.check_batching_keys(falcon(max_rolling_batch_size=64))
    refused(lmi.check_batching_keys, falcon(batching="dynamic", max_rolling_batch_size=64),
            "falcon.max_rolling_batch_size", "mutually exclusive", "falcon.batch_size")
    refused(lmi.check_batching_keys, falcon(batch_size=8), "falcon.batch_size", "falcon.max_rolling_batch_size")


def test_rolling_without_paging_only_where_the_container_offers_it():
    lmi.check_mode_in_version(falcon(lmi_version="0.23.0", batching="rolling"))
    for version in ("0.33.0", "0.35.0", "0.36.0-lmi27", "0.36.0-lmi28", "0.38.0-lmi29"):
        refused(lmi.check_mode_in_version, falcon(lmi_version=version, batching="rolling"), "falcon.batching",
                "lmi_version 0.23.0", "rolling_paged", "always pages")
    with pytest.raises(SettingsError):
        lmi.render(falcon(batching="rolling"))


def test_vllm_and_lmi_dist_settings_only_where_they_are_read():
    lmi.check_engine_settings(falcon(gpu_memory_utilization=0.8))
    lmi.check_engine_settings(falcon(lmi_version="0.23.0", output_formatter="jsonlines"))
    refused(lmi.check_engine_settings, falcon(batching="dynamic", gpu_memory_utilization=0.8),
            "falcon.gpu_memory_utilization", "only vLLM", "accelerate has no memory share")
    refused(lmi.check_engine_settings, falcon(output_formatter="jsonlines"), "falcon.output_formatter",
            "only 0.23.0's rolling batch", '"stream": true')


def test_a_revision_is_for_hub_downloads():
    lmi.check_revision_is_for_the_hub(falcon(model_revision="main"))
    refused(lmi.check_revision_is_for_the_hub, falcon(model_revision="main", model_s3_uri="s3://bucket/falcon/"),
            "falcon.model_revision", "what the S3 prefix holds")


def test_023_serves_only_models_whose_engine_it_infers_as_python():
    lmi.check_engine_is_known_on_023(falcon(lmi_version="0.23.0", model_id="tiiuae/falcon-7b"))
    lmi.check_engine_is_known_on_023(falcon(model_id="acme/llm-13b"))
    refused(lmi.check_engine_is_known_on_023, falcon(lmi_version="0.23.0", model_id="acme/llm-13b"),
            "falcon.model_id", "before it reads OPTION_ENGINE")


def test_an_unpinned_hub_model_is_a_warning():
    (warning,) = lmi.check(falcon(model_revision=None))
    assert "falcon.model_revision is not set" in warning
    assert lmi.check(falcon(model_revision=None, model_s3_uri="s3://bucket/falcon/")) == []


def test_prefill_budget_holds_a_prompt_unless_chunked():
    lmi.check_prefill_holds_a_prompt(falcon(max_rolling_batch_prefill_tokens=512))  # vLLM chunks the prompt
    lmi.check_prefill_holds_a_prompt(falcon(lmi_version="0.23.0", max_input_tokens=1024))
    refused(lmi.check_prefill_holds_a_prompt, falcon(lmi_version="0.23.0", max_rolling_batch_prefill_tokens=512),
            "falcon.max_rolling_batch_prefill_tokens", "at least falcon.max_input_tokens (1024)")


def test_tensor_parallel_at_most_the_gpu_count():
    lmi.check_tensor_parallel(falcon(instance_type="ml.g5.24xlarge", tensor_parallel_degree=4))
    refused(lmi.check_tensor_parallel, falcon(instance_type="ml.g5.24xlarge"), "falcon.tensor_parallel_degree",
            "at most 4", "ml.g5.24xlarge")


def test_tensor_parallel_divides_the_attention_heads():
    seven_b = falcon(model_id="tiiuae/falcon-7b", instance_type="ml.g5.12xlarge")
    lmi.check_tensor_parallel(dataclasses.replace(seven_b, tensor_parallel_degree=1))
    refused(lmi.check_tensor_parallel, dataclasses.replace(seven_b, tensor_parallel_degree=2),
            "falcon.tensor_parallel_degree", "71 attention heads")
    # Dynamic batching places whole layers on GPUs (accelerate): no head split, so any degree up to the count.
    lmi.check_tensor_parallel(dataclasses.replace(seven_b, tensor_parallel_degree=2, batching="dynamic"))


def test_only_gpu_instances_lmi_runs_on():
    refused(lmi.check_tensor_parallel, falcon(instance_type="ml.c7g.4xlarge"), "falcon.instance_type",
            "ml.g5.*", "ml.p5.*")
    refused(lmi.check_tensor_parallel, falcon(instance_type="ml.g5.96xlarge"), "falcon.instance_type")


def test_a_model_outside_the_catalogue_must_describe_itself():
    other = falcon(model_id="acme/llm-13b", tensor_parallel_degree=4, instance_type="ml.g5.12xlarge")
    error = refused(lmi.architecture, other, "falcon.model_layers", "acme/llm-13b", "falcon.model_kv_heads",
                    "falcon.model_parameters_billion")
    assert "falcon.model_layers" in error.allowed
    described = dataclasses.replace(other, model_layers=40, model_attention_heads=40, model_kv_heads=40,
                                    model_head_dim=128, model_parameters_billion=13.0)
    assert lmi.architecture(described) == lmi.Architecture(40, 40, 40, 128, 13.0)
    assert lmi.check(described) == []
    refused(lmi.check, dataclasses.replace(described, model_kv_heads=None), "falcon.model_kv_heads")


def test_settings_override_catalogue_numbers():
    assert lmi.architecture(falcon(model_layers=30)).layers == 30
    assert lmi.architecture(falcon(model_id="tiiuae/falcon-40b-instruct")) == lmi.CATALOGUE["tiiuae/falcon-40b"]


def test_weights_must_fit():
    lmi.check_memory(falcon(model_id="tiiuae/falcon-7b", instance_type="ml.g5.2xlarge", tensor_parallel_degree=1))
    refused(lmi.check_memory, falcon(instance_type="ml.g5.2xlarge", tensor_parallel_degree=1),
            "falcon.instance_type", "77.9 GiB", "tensor parallel 8 on ml.g5.48xlarge")


def test_weights_that_leave_no_kv_room_are_refused():
    refused(lmi.check_memory, falcon(instance_type="ml.g5.24xlarge", tensor_parallel_degree=4),
            "falcon.instance_type", "room for the KV cache", "19.5 GiB", "(vllm)",
            "tensor parallel 8 on ml.g5.48xlarge")


def test_memory_rule_follows_the_engine():
    """vLLM takes gpu_memory_utilization of each GPU; lmi-dist and accelerate have no share."""
    tp4 = falcon(instance_type="ml.g5.24xlarge", tensor_parallel_degree=4)
    assert lmi.sizing(tp4).budget_gib == pytest.approx(22.49 * 0.9, abs=0.01)
    assert lmi.sizing(dataclasses.replace(tp4, gpu_memory_utilization=0.95)).budget_gib == \
        pytest.approx(22.49 * 0.95, abs=0.01)
    lmi_dist = lmi.sizing(dataclasses.replace(tp4, lmi_version="0.23.0"))
    assert (lmi_dist.runtime, lmi_dist.memory_share, lmi_dist.kv_split) == ("lmi-dist", 1.0, "heads")
    dynamic = lmi.sizing(dataclasses.replace(tp4, batching="dynamic"))
    assert (dynamic.runtime, dynamic.memory_share, dynamic.kv_split) == ("accelerate", 1.0, "layers")
    # 60 layers over 4 GPUs: 15 layers' KV per GPU.
    assert dynamic.kv_bytes_per_token_per_gpu == 122_880 // 4
    # The recipe's TP 4 on 4x A10G: no KV room for vLLM at 0.9, some without a share (a tight fit, see README).
    assert lmi.sizing(tp4).largest_batch == 0 and lmi_dist.largest_batch > 0


def test_kv_room_must_hold_the_configured_batch_and_the_error_names_the_largest():
    largest = lmi.sizing(DEFAULT).largest_batch
    lmi.check_memory(falcon(max_rolling_batch_size=int(largest * 0.8)))
    refused(lmi.check_memory, falcon(max_rolling_batch_size=largest + 1), "falcon.max_rolling_batch_size",
            f"at most {largest}:", "1024 + 256 tokens")


def test_dynamic_batching_is_sized_by_batch_size():
    refused(lmi.check_memory, falcon(batching="dynamic", batch_size=64, max_input_tokens=16000,
                                     max_new_tokens=4000), "falcon.batch_size", "(accelerate)", "at most")


def test_little_headroom_is_a_warning():
    largest = lmi.sizing(DEFAULT).largest_batch
    assert lmi.check_memory(falcon(max_rolling_batch_size=int(largest * 0.8))) == []
    (warning,) = lmi.check_memory(falcon(max_rolling_batch_size=largest))
    assert "little headroom" in warning and "100% of the KV room" in warning


@pytest.mark.parametrize(("version", "batching"), VALID_COMBINATIONS)
def test_the_defaults_pass_in_every_version_and_mode(version, batching):
    assert lmi.check(falcon(lmi_version=version, batching=batching)) == []


def test_falcon_40b_on_a_single_a10g_is_refused():
    with pytest.raises(SettingsError, match=r"at most 1, the GPU count of one ml\.g5\.2xlarge"):
        lmi.check(load_settings("prod", {"falcon.instance_type": "ml.g5.2xlarge"}).falcon)
    with pytest.raises(SettingsError, match="GPUs that hold the weights"):
        lmi.check(falcon(instance_type="ml.g5.2xlarge", tensor_parallel_degree=1))


# --- sizing: the recipe's numbers ---------------------------------------------------------------------

def test_kv_bytes_per_token():
    forty, seven = lmi.CATALOGUE["tiiuae/falcon-40b"], lmi.CATALOGUE["tiiuae/falcon-7b"]
    assert lmi.kv_bytes_per_token(forty, "fp16") == 122_880  # 120 KiB; hidden-size formulas say 16x more
    assert lmi.kv_bytes_per_token(seven, "fp16") == 8_192
    # Tensor parallelism splits the 8 KV heads of Falcon-40B...
    assert lmi.kv_bytes_per_token_split_by_heads(forty, "fp16", 8) == 122_880 // 8
    assert lmi.kv_bytes_per_token_split_by_heads(forty, "fp16", 4) == 122_880 // 4
    # ...but a single KV head (multi-query) is replicated on every GPU.
    assert lmi.kv_bytes_per_token_split_by_heads(seven, "fp16", 4) == 8_192
    # Layer placement splits layers instead: 32 layers over 4 GPUs, 8 each.
    assert lmi.kv_bytes_per_token_split_by_layers(seven, "fp16", 4) == 8_192 // 4


def test_falcon_40b_tp4_on_g5_24xlarge_is_about_20_gb_per_gpu_at_about_84_percent():
    report = lmi.sizing(falcon(instance_type="ml.g5.24xlarge", tensor_parallel_degree=4))
    assert report.weights_gib == pytest.approx(77.93, abs=0.01)  # 41.84 B x 2 bytes = 83.7 GB
    assert report.weights_per_gpu_gib == pytest.approx(19.48, abs=0.01)  # the recipe: about 20 GB
    # The recipe's 84% is 20/24 from rounded figures; exactly, 87% of the 22.5 GiB an A10G gives CUDA.
    assert report.weights_share == pytest.approx(0.84, abs=0.04)
    assert report.tokens_fit == 0 and report.largest_batch == 0


def test_falcon_40b_tp8_on_g5_48xlarge_is_about_10_gb_per_gpu():
    report = lmi.sizing(DEFAULT)
    assert report.weights_per_gpu_gib == pytest.approx(9.74, abs=0.01)
    assert report.weights_share == pytest.approx(0.43, abs=0.01)  # "about 60% left" for activations and KV
    assert report.kv_bytes_per_token_per_gpu == 15_360
    room = (23028 / 1024 * 0.9 - 77.93 / 8 - lmi.RESERVE_GIB) * lmi.GIB
    assert report.tokens_fit == pytest.approx(room / 15_360, rel=1e-3)
    assert report.largest_batch == report.tokens_fit // 1280


def test_report_speaks_the_recipes_terms():
    text = lmi.sizing(DEFAULT).format_report()
    for fragment in ("ml.g5.48xlarge (8x A10G", "9.7 GiB per GPU = 43% of GPU memory", "122,880 bytes per token",
                     "15,360 per GPU", "tokens", "largest batch", "max_rolling_batch_size=32", "engine vllm",
                     "0.9 x 22.5 GiB (vLLM gpu_memory_utilization)"):
        assert fragment in text, text


# --- images -------------------------------------------------------------------------------------------

def test_image_uri_per_region_and_version():
    assert lmi.image_uri("us-west-2", "0.23.0") == \
        "763104351884.dkr.ecr.us-west-2.amazonaws.com/djl-inference:0.23.0-deepspeed0.9.5-cu118"
    assert lmi.image_uri("cn-north-1", "0.33.0") == \
        "727897471807.dkr.ecr.cn-north-1.amazonaws.com.cn/djl-inference:0.33.0-lmi15.0.0-cu128"
    assert lmi.repository_arn("us-gov-west-1") == \
        "arn:aws-us-gov:ecr:us-gov-west-1:442386744353:repository/djl-inference"
    with pytest.raises(SettingsError) as caught:
        lmi.image_uri("xx-nowhere-1", "0.33.0")
    assert caught.value.key == "region"


def test_image_uris_agree_with_the_sagemaker_sdk():
    """The SDK's offline image_uris, for every region and version both know (the SDK may lag or lead).

    Accounts, repository and tag come from the SDK's tables for every pair; `retrieve()` itself (about 80 ms a
    call) checks the URI's form in one region of each partition.
    """
    from sagemaker.core import image_uris

    from stacks.images import DLC_ACCOUNTS

    compared = 0
    for framework in ("djl-lmi", "djl-deepspeed"):
        versions = image_uris.config_for_framework(framework)["versions"]
        for version, tag in lmi.IMAGE_TAGS.items():
            release = version.partition("-")[0]  # 0.36.0-lmi27 is the SDK's 0.36.0 today
            if release not in versions or versions[release]["tag_prefix"] != tag:
                continue
            sdk = versions[release]
            assert sdk["repository"] == lmi.REPOSITORY
            # Our table holds every DLC region; LMI images may not be in all of them, so compare where both know.
            shared = set(DLC_ACCOUNTS) & set(sdk["registries"])
            assert len(shared) >= len(DLC_ACCOUNTS) - 2, sorted(set(DLC_ACCOUNTS) - set(sdk["registries"]))
            for region in shared:
                assert lmi.image_uri(region, version).split(".", 1)[0] == sdk["registries"][region], region
                compared += 1
            for region in ("us-west-2", "eu-central-2", "cn-northwest-1", "us-gov-east-1"):
                assert lmi.image_uri(region, version) == image_uris.retrieve(framework, region=region, version=release)
    # every version of ours but 0.36.0-lmi28 is in the SDK (see the next test)
    assert compared >= (len(lmi.IMAGE_TAGS) - 1) * (len(DLC_ACCOUNTS) - 2)


def test_every_selectable_version_has_an_image_and_rules():
    from settings.serving import LMI_VERSIONS

    assert set(LMI_VERSIONS) == set(lmi.IMAGE_TAGS) == set(lmi.VERSIONS)
    with pytest.raises(SettingsError, match=r"falcon\.lmi_version"):
        lmi.container("0.99.0")


def test_every_offered_version_is_in_the_sagemaker_sdks_lmi_tables():
    from sagemaker.core import image_uris

    tables = {**image_uris.config_for_framework("djl-deepspeed")["versions"],
              **image_uris.config_for_framework("djl-lmi")["versions"]}
    in_sdk = {version for version, tag in lmi.IMAGE_TAGS.items()
              if tables.get(version.partition("-")[0], {}).get("tag_prefix") == tag}
    # 0.36.0-lmi28 is published (AWS's available_images data, versions.py) but the SDK's key 0.36.0 names lmi27.
    assert set(lmi.IMAGE_TAGS) - in_sdk == {"0.36.0-lmi28"}
    assert tables["0.38.0"]["tag_prefix"] == lmi.IMAGE_TAGS["0.38.0-lmi29"]


def test_local_nvme_instance_types():
    assert lmi.has_local_nvme("ml.g5.48xlarge") and lmi.has_local_nvme("ml.p4d.24xlarge")
    assert not lmi.has_local_nvme("ml.c7g.4xlarge")


# --- command line ---------------------------------------------------------------------------------------

def test_cli_renders_the_environments_properties_file(capsys):
    assert main(["render", "--env", "prod"]) == 0
    out = capsys.readouterr().out
    # prod's defaults: LMI 0.33 (vLLM, engine Python), the recipe's TP 8 fp16, batch 32, prefill 1024.
    assert parse_properties(out) == {
        "engine": "Python", "option.model_id": "tiiuae/falcon-40b", "option.tensor_parallel_degree": "8",
        "option.dtype": "fp16", "option.trust_remote_code": "false", "option.model_loading_timeout": "1800",
        "option.entryPoint": "djl_python.lmi_vllm.vllm_async_service", "option.async_mode": "true",
        "option.rolling_batch": "vllm", "option.max_rolling_batch_size": "32",
        "option.max_rolling_batch_prefill_tokens": "1024", "option.max_model_len": "1280",
        "option.gpu_memory_utilization": "0.9", "option.enable_chunked_prefill": "true"}


def test_cli_renders_environment_variables_with_overrides(capsys):
    assert main(["render", "--format", "env", "--lmi-version", "0.23.0", "--batching", "rolling"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "OPTION_PAGED_ATTENTION=false" in lines and "OPTION_MPI_MODE=true" in lines
    assert "HF_MODEL_ID=tiiuae/falcon-40b" in lines


def test_cli_sizing_prints_the_report_and_refuses_what_cannot_run(capsys):
    assert main(["sizing", "--instance-type", "ml.g5.24xlarge", "--tensor-parallel-degree", "4"]) == 1
    captured = capsys.readouterr()
    assert "19.5 GiB per GPU = 87% of GPU memory" in captured.out
    (line,) = captured.err.splitlines()
    assert line.startswith("error: invalid setting falcon.instance_type='ml.g5.24xlarge'")


def test_cli_warnings_go_to_stderr(capsys):
    largest = lmi.sizing(DEFAULT).largest_batch
    assert main(["sizing", "--max-rolling-batch-size", str(largest), "--model-revision", "main"]) == 0
    assert capsys.readouterr().err.startswith("warning: little headroom")


def test_cli_validates_flags_like_synth(capsys):
    assert main(["render", "--tensor-parallel-degree", "three"]) == 1
    assert capsys.readouterr().err.strip() == \
        "error: invalid setting falcon.tensor_parallel_degree='three': expected one of 1, 2, 4, 8"


def test_cli_usage(capsys):
    assert main(["--help"]) == 0
    assert "sizing" in capsys.readouterr().out
    assert main(["sizing", "--no-such-flag"]) == 2
    assert main([]) == 2


def test_module_runs_without_aws_cdk_and_exits_1_on_a_bad_combination():
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "inference.llm.lmi", "sizing", "--instance-type", "ml.g5.2xlarge"],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if not line.startswith("import time:")]
    assert errors == ["error: invalid setting falcon.tensor_parallel_degree=8: expected at most 1, the GPU count "
                      "of one ml.g5.2xlarge"]
    assert "aws_cdk" not in result.stderr and "jsii" not in result.stderr
