"""Every configuration inference.llm.lmi renders, run through DJL Serving's start-up as its source says it behaves.

tests/lmi_container.py encodes DJL Serving's code per release branch (each step cites its file). Here every offered
version x batching mode x output form (environment, serving.properties) x weights source (hub, S3) is started
there, and what the container would do is compared with what the README's table promises (EXPECTED below, written
from the README and DJL's code, not from inference.llm.lmi.versions). A second group replays the forms the stack used
to deploy, to show the container model catches the faults the issue found.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from inference.llm import lmi
from inference.llm.lmi.vllm import start_checks
from inference.llm.lmi.vllm_engine_args import VLLM_SOURCES
from settings import SettingsError
from settings.serving import FalconSettings
from tests import fake_lmi
from tests.lmi_container import (
    BRANCH_VLLM,
    BRANCHES,
    FALCON_HUB_CONFIG,
    FALCON_RW_CONFIG,
    MODEL_STORE,
    StartupError,
    start,
    vllm_engine_arguments,
)

RECIPE = FalconSettings()  # Falcon-40B fp16, TP 8 on ml.g5.48xlarge, batch 32, prefill 1024
SMOKE = dataclasses.replace(RECIPE, model_id="tiiuae/falcon-7b", instance_type="ml.g5.2xlarge",
                            tensor_parallel_degree=1, max_rolling_batch_size=8, max_input_tokens=512,
                            max_new_tokens=128)
REVISION = "0123456789abcdef0123456789abcdef01234567"
HUB = {"tiiuae/falcon-40b": FALCON_HUB_CONFIG, "tiiuae/falcon-7b": FALCON_HUB_CONFIG}
WEIGHTS = {"config.json": json.dumps(FALCON_HUB_CONFIG), "model-00001-of-00001.safetensors": "..."}
S3_URI = "s3://models-bucket/falcon/"

# The README's table: what serves each mode. mpi: ranks under mpirun (true tensor parallelism in lmi-dist).
PIPELINE = {"mpi": False, "backend": "pipeline", "paged_attention": False, "device_map": "auto"}
VLLM_ERA = ("0.33.0", "0.35.0", "0.36.0-lmi27")  # public DJL branches (tests/lmi_container.py BRANCHES)
# No public DJL source: their renderings go through the nearest public branch, 0.36.0-lmi27 (an assumption the
# README states; their vLLM arguments are still checked against their own vLLM).
NOT_PUBLIC = {"0.36.0-lmi28": "0.36.0-lmi27", "0.38.0-lmi29": "0.36.0-lmi27"}
EXPECTED = {
    ("0.23.0", "dynamic"): PIPELINE,
    ("0.23.0", "rolling"): {"mpi": True, "backend": "lmi-dist", "paged_attention": False},
    ("0.23.0", "rolling_paged"): {"mpi": True, "backend": "lmi-dist", "paged_attention": True},
    **{(v, "dynamic"): PIPELINE for v in (*VLLM_ERA, *NOT_PUBLIC)},
    **{(v, "rolling_paged"): {"mpi": False, "backend": "vllm-async", "paged_attention": True}
       for v in (*VLLM_ERA, *NOT_PUBLIC)},
}
REFUSED = {(v, "rolling") for v in (*VLLM_ERA, *NOT_PUBLIC)}
# The vLLM whose arguments each image's rendering is checked against: the one it bundles (its release data).
BUNDLED_VLLM = {"0.33.0": "0.8.4", "0.35.0": "0.11.1", "0.36.0-lmi27": "0.23.0", "0.36.0-lmi28": "0.26.0",
                "0.38.0-lmi29": "0.28.0"}


def test_the_offered_versions_are_the_ones_read():
    assert set(lmi.VERSIONS) == {"0.23.0", *VLLM_ERA, *NOT_PUBLIC}
    offered = {(v, m) for v in lmi.VERSIONS for m in ("dynamic", "rolling", "rolling_paged")}
    assert offered == set(EXPECTED) | REFUSED
    assert {v: lmi.container(v).vllm_rules for v in BUNDLED_VLLM} == BUNDLED_VLLM
    assert {v for v in lmi.VERSIONS if not lmi.container(v).public_source} == set(NOT_PUBLIC)


def test_rules_and_container_model_were_read_at_the_same_commits():
    """versions.py (the rendering's rules), tests/lmi_container.py (DJL's start-up) and tests/fake_lmi.py (what
    DJL sends) cite the same branch commits; a re-read at a newer commit must update all three."""
    assert {v: (lmi.container(v).branch, lmi.container(v).commit) for v in BRANCHES} == BRANCHES
    # The fake LMI's bytes (tests/fake_lmi.py, what the streaming client is tested on) were read there too.
    assert fake_lmi.SOURCES == BRANCHES
    assert {lmi.container(v).commit for v in NOT_PUBLIC} == {BRANCHES["0.36.0-lmi27"][1]}


def branch(version: str) -> str:
    """The DJL branch model a version's rendering runs through."""
    return NOT_PUBLIC.get(version, version)


def configure(base: FalconSettings, version: str, batching: str, source: str) -> FalconSettings:
    if batching == "dynamic":  # the rolling keys keep their defaults (check_batching_keys)
        base = dataclasses.replace(base, max_rolling_batch_size=32, max_rolling_batch_prefill_tokens=1024)
    if source == "s3":
        return dataclasses.replace(base, lmi_version=version, batching=batching, model_s3_uri=S3_URI)
    return dataclasses.replace(base, lmi_version=version, batching=batching, model_revision=REVISION)


def container_inputs(falcon: FalconSettings, form: str) -> tuple[dict[str, str], dict[str, str]]:
    """(environment, /opt/ml/model files) as SageMaker hands them to the container for each output form."""
    store = dict(WEIGHTS) if falcon.model_s3_uri else {}
    if form == "environment":
        return lmi.to_environment(falcon), store
    return {}, {**store, "serving.properties": lmi.to_properties_file(lmi.render(falcon))}


CASES = [(version, batching, form, source, name)
         for (version, batching) in sorted(EXPECTED)
         for form in ("environment", "properties") for source in ("hub", "s3") for name in ("recipe", "smoke")]


@pytest.mark.parametrize(("version", "batching", "form", "source", "name"), CASES)
def test_the_container_loads_one_model_with_the_promised_engine_backend_paging_and_sharding(
        version, batching, form, source, name):
    """Registration (ModelServer.java / util/ModelStore.java), engine and MPI (ModelInfo.java, PyModel.java),
    entry point and backend (PyModel.java, huggingface.py, LmiConfigRecommender.java), device_map
    (hf_properties.py) at each offered release branch; see tests/lmi_container.py for the file of each step."""
    falcon = configure(RECIPE if name == "recipe" else SMOKE, version, batching, source)
    lmi.check(falcon)  # passes the synth-time rules
    environment, store = container_inputs(falcon, form)
    (model,) = start(branch(version), environment, store, HUB).models  # exactly one model registered
    expected = EXPECTED[(version, batching)]
    assert {key: getattr(model, key) for key in expected} == expected
    assert model.weights == (MODEL_STORE if source == "s3" else falcon.model_id)
    assert model.revision == (None if source == "s3" else REVISION)
    assert model.options["tensor_parallel_degree"] == str(falcon.tensor_parallel_degree)
    assert model.options["dtype"] == "fp16"
    assert model.options["model_loading_timeout"] == str(falcon.model_loading_timeout_s)
    if batching == "dynamic":
        assert model.batch_size == falcon.batch_size
        assert model.options["rolling_batch"] == "disable" if version != "0.23.0" else "rolling_batch" not in \
            model.options
    else:
        assert model.batch_size == 1
        assert model.options["max_rolling_batch_size"] == str(falcon.max_rolling_batch_size)
    if expected["backend"] == "vllm-async":
        engine_args = VLLM_SOURCES[BUNDLED_VLLM[version]]["engine_args"]
        arguments = vllm_engine_arguments(model, engine_args, VLLM_SOURCES[BRANCH_VLLM[branch(version)]]
                                          ["store_boolean"])
        # every name DJL hands to vLLM is an engine argument of the image's vLLM, and vLLM's checks pass
        assert [name for name in arguments if name not in engine_args] == []
        start_checks(BUNDLED_VLLM[version], arguments, lmi.architecture(falcon))
        max_model_len = falcon.max_input_tokens + falcon.max_new_tokens
        assert arguments["max_model_len"] == str(max_model_len)
        assert arguments["tensor_parallel_size"] == str(falcon.tensor_parallel_degree)
        assert arguments["max_num_seqs"] == str(falcon.max_rolling_batch_size)
        assert arguments["dtype"] == "float16"
        assert arguments["gpu_memory_utilization"] == "0.9"
        # vLLM refuses max_num_batched_tokens < max_model_len unless chunked prefill is on.
        if int(arguments["max_num_batched_tokens"]) < max_model_len:
            assert arguments["enable_chunked_prefill"] == "true"
        else:
            assert "enable_chunked_prefill" not in arguments


@pytest.mark.parametrize(("version", "batching"), sorted(REFUSED))
def test_modes_a_version_cannot_run_are_refused_with_the_reason(version, batching):
    with pytest.raises(SettingsError) as caught:
        lmi.check(configure(RECIPE, version, batching, "hub"))
    assert caught.value.key == "falcon.batching"
    assert "always pages the KV cache" in caught.value.allowed and "0.23.0" in caught.value.allowed


def test_the_recipes_three_configurations_on_its_container_and_the_default_one():
    """dynamic TP 8 batch 4 delay 100; rolling lmi-dist; rolling with PagedAttention; fp16, prefill 1024, batch 32."""
    recipe_modes = {"dynamic": "pipeline", "rolling": "lmi-dist", "rolling_paged": "lmi-dist"}
    for batching, backend in recipe_modes.items():
        falcon = configure(RECIPE, "0.23.0", batching, "hub")
        (model,) = start("0.23.0", lmi.to_environment(falcon), {}, HUB).models
        assert model.backend == backend
        if batching == "dynamic":
            assert (model.batch_size, lmi.render(falcon)["max_batch_delay"]) == (4, "100")
        else:
            assert model.options["max_rolling_batch_prefill_tokens"] == "1024"
    (model,) = start("0.33.0", lmi.to_environment(configure(RECIPE, "0.33.0", "rolling_paged", "hub")), {},
                     HUB).models
    assert model.backend == "vllm-async"


# --- what the old rendering did, through the same container model ------------------------------------------

def test_option_model_id_alone_registers_no_model():
    """0.23.0-dlc ModelServer.java initModelStore / 0.33.0-dlc util/ModelStore.java: only the model store and
    HF_MODEL_ID register start-up models; an empty /opt/ml/model maps to none."""
    for version in ("0.23.0", "0.33.0"):
        assert start(version, {"OPTION_MODEL_ID": "tiiuae/falcon-40b", "OPTION_ENGINE": "Python"}, {}, HUB).models == []


def test_023_option_engine_does_not_start_mpi():
    """0.23.0-dlc wlm/.../ModelInfo.java: the engine is inferred (Python for Falcon) before OPTION_* are merged;
    option.mpi_mode (PyModel.java) is what starts mpirun."""
    environment = {"HF_MODEL_ID": "tiiuae/falcon-40b", "OPTION_ENGINE": "MPI", "OPTION_TENSOR_PARALLEL_DEGREE": "8",
                   "OPTION_ROLLING_BATCH": "lmi-dist"}
    with pytest.raises(StartupError, match="needs the MPI launch"):
        start("0.23.0", environment, {}, HUB)
    (model,) = start("0.23.0", {**environment, "OPTION_MPI_MODE": "true"}, {}, HUB).models
    assert (model.engine, model.mpi, model.backend) == ("Python", True, "lmi-dist")


def test_023_auto_sends_falcon_to_the_scheduler_unless_the_config_says_rw():
    """0.23.0-dlc huggingface.py: `auto` picks lmi-dist only for LMI_DIST_ADV_MODEL (RWForCausalLM, not
    FalconForCausalLM, which Falcon's hub config says today)."""
    environment = {"HF_MODEL_ID": "tiiuae/falcon-40b", "OPTION_MPI_MODE": "true", "OPTION_ROLLING_BATCH": "auto",
                   "OPTION_TENSOR_PARALLEL_DEGREE": "8"}
    (model,) = start("0.23.0", environment, {}, HUB).models
    assert model.backend == "scheduler"
    (model,) = start("0.23.0", environment, {}, {"tiiuae/falcon-40b": FALCON_RW_CONFIG}).models
    assert model.backend == "lmi-dist"


def test_dynamic_batching_without_device_map_loads_on_one_gpu_from_033():
    """0.33.0-dlc properties_manager/hf_properties.py: device_map=auto only when rolling batch is on."""
    properties = "engine=Python\noption.model_id=tiiuae/falcon-40b\noption.entryPoint=djl_python.huggingface\n" \
                 "option.rolling_batch=disable\noption.tensor_parallel_degree=8\nbatch_size=4\n"
    (model,) = start("0.33.0", {}, {"serving.properties": properties}, HUB).models
    assert (model.backend, model.device_map) == ("pipeline", None)


def test_dynamic_batching_needs_its_entry_point_from_033():
    """0.33.0-dlc PyModel.java: with SERVING_FEATURES=vllm and no entry point the vLLM async service starts. It
    starts healthy with batch_size 4, then answers 424 to every request the batcher groups with another
    (lmi_vllm/vllm_async_service.py preprocess_request asserts len(batch) == 1); a request alone succeeds."""
    environment = {"HF_MODEL_ID": "tiiuae/falcon-40b", "OPTION_ROLLING_BATCH": "disable", "SERVING_BATCH_SIZE": "4"}
    (model,) = start("0.33.0", environment, {}, HUB).models
    assert (model.backend, model.batch_size) == ("vllm-async", 4)
    assert model.answer(1) == (200, "generated text")
    assert model.answer(2) == (424, "Input parsing failed: only one request per batch allowed")
    # 0.35+ start huggingface.py unless async mode is on; it batches.
    (model,) = start("0.35.0", environment, {}, HUB).models
    assert model.entry_point == "djl_python.huggingface"
    assert model.answer(4) == (200, "generated text")


@pytest.mark.parametrize("version", [v for v in lmi.VERSIONS if v != "0.23.0"])
def test_our_dynamic_batching_never_reaches_the_vllm_service(version):
    """What the stack renders for dynamic batching names huggingface.py, so a full batch of 4 is answered."""
    falcon = configure(RECIPE, version, "dynamic", "hub")
    (model,) = start(branch(version), lmi.to_environment(falcon), {}, HUB).models
    assert model.answer(falcon.batch_size) == (200, "generated text")


def test_lmi_dist_is_rewritten_to_vllm_from_033():
    """0.33.0-dlc+ wlm/.../LmiConfigRecommender.java setRollingBatch: lmi-dist becomes vllm with mpi_mode off,
    so the recipe's lmi-dist backend exists only on 0.23."""
    for version in VLLM_ERA:
        environment = {"HF_MODEL_ID": "tiiuae/falcon-40b", "OPTION_ENGINE": "MPI", "OPTION_ROLLING_BATCH": "lmi-dist",
                       "OPTION_ENTRYPOINT": "djl_python.huggingface"}
        (model,) = start(version, environment, {}, HUB).models
        assert (model.options["rolling_batch"], model.backend) == ("vllm", "vllm")


def test_revision_variables_differ_by_version_option_revision_does_not():
    """0.23.0-dlc ModelServer.java reads HF_MODEL_REVISION, 0.33.0-dlc+ util/ModelStore.java HF_REVISION;
    OPTION_REVISION fills option.revision in both (ModelInfo.java), which is what the stack sets."""
    for version, variable in (("0.23.0", "HF_MODEL_REVISION"), ("0.33.0", "HF_REVISION")):
        (model,) = start(version, {"HF_MODEL_ID": "tiiuae/falcon-40b", variable: REVISION}, {}, HUB).models
        assert model.revision == REVISION
        (model,) = start(version, {"HF_MODEL_ID": "tiiuae/falcon-40b", "OPTION_REVISION": REVISION}, {}, HUB).models
        assert model.revision == REVISION


def test_023_a_local_model_id_in_serving_properties_needs_the_engine_named():
    """0.23.0-dlc LmiUtils.java: without `engine`, a model_id is looked up on the hub, a local path too."""
    properties = "option.model_id=/opt/ml/model\noption.tensor_parallel_degree=8\n"
    with pytest.raises(StartupError, match="fetches its config from the hub"):
        start("0.23.0", {}, {**WEIGHTS, "serving.properties": properties}, HUB)
    (model,) = start("0.23.0", {}, {**WEIGHTS, "serving.properties": "engine=Python\n" + properties}, HUB).models
    assert model.weights == "/opt/ml/model"
