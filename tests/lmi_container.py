"""What DJL Serving does at start with a model folder and an environment, per release branch, in plain Python.

Written from DJL Serving's own source (github.com/deepjavalibrary/djl-serving), not from inference.llm.lmi: each step
names the file and branch it encodes. tests/test_lmi_conformance.py runs every configuration inference.llm.lmi renders
through `start()` and compares what the container would do with what the settings and the README promise.

Branches read: BRANCHES below, with the commit each was read at (so a later re-read shows drift). Only the steps
that decide which model loads, on which engine, with which backend, paging and sharding, and which arguments reach
vLLM, are encoded; what happens inside lmi-dist (closed source) and vLLM is not (vLLM's own start-up checks are
inference.llm.lmi.vllm.start_checks, from vLLM's source). LMI 0.36.0-lmi28 and 0.38.0-lmi29 have no public branch.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

MODEL_STORE = "/opt/ml/model"

# Falcon's config.json on the hub's main branch today (architectures and model_type are what DJL reads).
FALCON_HUB_CONFIG = {"architectures": ["FalconForCausalLM"], "model_type": "falcon"}
# What the first Falcon uploads said (remote code, modelling_RW.py).
FALCON_RW_CONFIG = {"architectures": ["RWForCausalLM"], "model_type": "RefinedWeb"}

# 0.23.0-dlc wlm/src/main/java/ai/djl/serving/wlm/LmiUtils.java: model types sent to DeepSpeed.
DEEPSPEED_MODELS_023 = {"bert", "bloom", "gpt_neo", "gpt_neox", "gpt2", "gptj", "opt", "roberta", "xlm-roberta"}
# 0.23.0-dlc engines/python/setup/djl_python/huggingface.py: architectures `auto` sends to lmi-dist.
LMI_DIST_ADV_MODEL_023 = {"RWForCausalLM", "GPTNeoXForCausalLM", "T5ForConditionalGeneration", "LlamaForCausalLM"}
# wlm/.../LmiConfigRecommender.java (0.33+): architectures counted as text generation.
TEXT_GENERATION_SUFFIXES = ("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")

# Version -> (DJL Serving branch, commit read). Every rule below names the branch it comes from.
BRANCHES = {
    "0.23.0": ("0.23.0-dlc", "07673c54097d8a51bf6e526d3268b7d19e8b5425"),
    "0.33.0": ("0.33.0-dlc", "8b3b685b65f0ba1d89ce471c0f1cefc09dc36da2"),
    "0.35.0": ("0.35.0-dlc", "637866135ee775bc1533808e843d7c32c8a2c179"),
    "0.36.0-lmi27": ("0.36.0-lmi27-dlc", "7e13b081383bd46293d4b49ab214d4757b1effd5"),
}
VERSIONS = tuple(BRANCHES)
# The vLLM each branch installs (serving/docker/lmi-container-requirements.txt; 0.35: AWS's release data, see
# inference/llm/lmi/versions.py), whose EngineArgs decide which options DJL passes on.
BRANCH_VLLM = {"0.33.0": "0.8.4", "0.35.0": "0.11.1", "0.36.0-lmi27": "0.23.0"}


class StartupError(Exception):
    """The container would fail to load the model; the message says where in DJL Serving."""


@dataclass
class LoadedModel:
    """One model the server registered at start, and how it would be served."""

    url: str
    engine: str  # the DJL engine (Python, MPI, DeepSpeed, ...)
    mpi: bool  # worker processes started under mpirun, one per tensor-parallel rank
    entry_point: str
    backend: str  # "pipeline" (transformers, no rolling batch), "lmi-dist", "scheduler", "vllm", "vllm-async"
    paged_attention: bool
    device_map: str | None  # accelerate placement in the pipeline path
    weights: str  # what the Python side loads: a hub id or a folder
    revision: str | None
    batch_size: int
    options: dict[str, str] = field(default_factory=dict)  # what the Python handler receives
    version: str = ""

    def answer(self, requests_in_batch: int) -> tuple[int, str]:
        """(status, body) of a request that DJL hands to the handler in a batch of this many.

        0.33.0-dlc+ lmi_vllm/vllm_async_service.py preprocess_request: `assert len(batch) == 1, "only one request
        per batch allowed"`, caught in inference() and answered with create_non_stream_output(error="Input parsing
        failed: ...", code=424). The server starts healthy; requests fail whenever the batcher groups them.
        """
        if self.backend == "vllm-async" and requests_in_batch > 1:
            return 424, "Input parsing failed: only one request per batch allowed"
        return 200, "generated text"


@dataclass
class Startup:
    models: list[LoadedModel]


def _image_environment(version: str) -> dict[str, str]:
    """Set by the image itself: 0.33.0-dlc+ serving/docker/lmi.Dockerfile `ENV SERVING_FEATURES=vllm`."""
    return {} if version == "0.23.0" else {"SERVING_FEATURES": "vllm"}


def parse_properties(text: str) -> dict[str, str]:
    """java.util.Properties, as far as our files use it (key=value lines, # comments)."""
    pairs = [line.split("=", 1) for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return {key.strip(): value.strip() for key, value in pairs}


def start(version: str, environment: Mapping[str, str], model_store: Mapping[str, str],
          hub_configs: Mapping[str, dict] | None = None, gpus: int = 8) -> Startup:
    """What the server registers and loads.

    model_store: the files SageMaker put in /opt/ml/model (name -> text; weights can be any placeholder);
    hub_configs: config.json on the hub's main branch, by model id (DJL reads it over the network at start).
    """
    if version not in VERSIONS:
        raise ValueError(version)
    env = {**_image_environment(version), **environment}
    hub_configs = hub_configs or {}
    folders = _registered_folders(version, env, model_store)
    return Startup([_load(version, env, files, url, hub_configs, gpus) for url, files in folders])


# --- registration ---------------------------------------------------------------------------------------

def _registered_folders(version: str, env: Mapping[str, str],
                        model_store: Mapping[str, str]) -> list[tuple[str, dict[str, str]]]:
    """0.23.0-dlc serving/src/main/java/ai/djl/serving/ModelServer.java initModelStore + createHuggingFaceModel;
    0.33.0-dlc+ serving/src/main/java/ai/djl/serving/util/ModelStore.java (same two sources of start-up models).

    The model store (/opt/ml/model) is registered when it is not empty (mapModelUrl: an empty folder maps to no
    model). HF_MODEL_ID adds a model whose folder holds a generated serving.properties with option.model_id, and
    option.revision from HF_MODEL_REVISION (0.23) or HF_REVISION (0.33+). Nothing else registers a model at
    start: OPTION_MODEL_ID is only a property of a model that is registered.
    """
    folders = []
    if model_store:
        folders.append((MODEL_STORE, dict(model_store)))
    model_id = env.get("HF_MODEL_ID")
    if model_id is not None:
        generated = {"option.model_id": model_id}
        revision = env.get("HF_MODEL_REVISION" if version == "0.23.0" else "HF_REVISION")
        if revision is not None:
            generated["option.revision"] = revision
        text = "\n".join(f"{k}={v}" for k, v in generated.items())
        folders.append((f"hf:{model_id}", {"serving.properties": text}))
    return folders


# --- per-model properties and engine ------------------------------------------------------------------------

def _merge_environment(version: str, prop: dict[str, str], env: Mapping[str, str]) -> None:
    """OPTION_X fills option.x only where serving.properties lacks it (putIfAbsent).

    0.23.0-dlc wlm/.../ModelInfo.java configPerModelSettings: every OPTION_X becomes option.x (lower case), so
    OPTION_ENGINE is option.engine there. 0.33.0-dlc+ ModelInfo.java loadServingProperties: OPTION_ENGINE fills
    `engine`, OPTION_ENTRYPOINT fills option.entryPoint, empty values are skipped.
    """
    for key, value in env.items():
        if not key.startswith("OPTION_"):
            continue
        name = key.removeprefix("OPTION_")
        if version == "0.23.0":
            prop.setdefault("option." + name.lower(), value)
            continue
        if not value:
            continue
        name = name.lower() if name.upper() == name else name
        if name == "entrypoint":
            name = "entryPoint"
        elif name == "engine":
            prop.setdefault("engine", value)
            continue
        prop.setdefault("option." + name, value)


def _config(files: Mapping[str, str], prop: Mapping[str, str], hub_configs: Mapping[str, dict],
            config_from_model_id: bool) -> dict | None:
    """The model's config.json: in the folder, else (model_id given) from the hub's main branch."""
    import json

    if "config.json" in files:
        return json.loads(files["config.json"])
    model_id = prop.get("option.model_id")
    if config_from_model_id and model_id and not model_id.startswith("/"):
        if model_id not in hub_configs:
            raise StartupError(f"Invalid huggingface model id: {model_id} (no config.json on the hub)")
        return hub_configs[model_id]
    return None


def _infer_engine_023(files: Mapping[str, str], prop: dict[str, str], hub_configs: Mapping[str, dict]) -> str:
    """0.23.0-dlc ModelInfo.java inferEngine + LmiUtils.java inferLmiEngine, which run BEFORE the OPTION_* merge.

    A Python model (option.model_id in serving.properties, or a config.json) gets the engine recommended for its
    model_type: DeepSpeed for DEEPSPEED_MODELS (deepspeed is installed in the 0.23 image), else Python. With a
    local path as option.model_id and no engine, 0.23 asks the hub for `https://huggingface.co/<path>/raw/main/
    config.json` and fails.
    """
    if "engine" in prop:
        return prop["engine"]
    if "option.model_id" not in prop and "config.json" not in files:
        raise StartupError("Failed to detect engine of the model")
    model_id = prop.get("option.model_id")
    if model_id is not None and model_id.startswith("/"):
        raise StartupError(f"Invalid huggingface model id: {model_id} (0.23 fetches its config from the hub)")
    config = _config(files, prop, hub_configs, config_from_model_id=model_id is not None)
    if config is None:
        return "Python"
    if config.get("model_type") in DEEPSPEED_MODELS_023:
        return "DeepSpeed"
    return "Python"


def _recommend(version: str, prop: dict[str, str], config: dict | None, env: Mapping[str, str]) -> None:
    """0.33.0-dlc+ wlm/.../LmiConfigRecommender.java setRollingBatch (run from LmiUtils.configureLmiModel).

    batch_size > 1 turns rolling batch off. lmi-dist is rewritten to vllm (0.33+). `auto` (the default) with the
    vllm feature means vllm in 0.33, and rolling batch off with option.async_mode=true from 0.35. Explicit values
    stay.
    """
    if config is None:
        return
    if int(prop.get("batch_size", "1")) > 1:
        prop["option.rolling_batch"] = "disable"
        return
    rolling = prop.get("option.rolling_batch", "auto")
    if rolling == "lmi-dist":
        prop["option.rolling_batch"] = "vllm"
        prop["option.mpi_mode"] = "false"
        return
    if rolling != "auto":
        return
    architectures = config.get("architectures") or []
    if not any(a.endswith(TEXT_GENERATION_SUFFIXES) for a in architectures):
        prop["option.rolling_batch"] = "disable"
    elif "vllm" in env.get("SERVING_FEATURES", ""):
        if version == "0.33.0":
            prop["option.rolling_batch"] = "vllm"
        else:
            prop["option.rolling_batch"] = "disable"
            prop["option.async_mode"] = "true"
    else:
        prop["option.rolling_batch"] = "disable"


def _load(version: str, env: Mapping[str, str], files: Mapping[str, str], url: str,
          hub_configs: Mapping[str, dict], gpus: int) -> LoadedModel:
    prop = parse_properties(files.get("serving.properties", ""))
    if version == "0.23.0":
        engine = _infer_engine_023(files, prop, hub_configs)
        _merge_environment(version, prop, env)
        mpi = engine == "MPI" or prop.get("option.mpi_mode", "false").lower() == "true"
    else:
        _merge_environment(version, prop, env)
        config = _config(files, prop, hub_configs, config_from_model_id=True)
        _recommend(version, prop, config, env)
        # ModelInfo.java inferEngine: `engine` if given; a model with option.model_id or config.json is Python.
        engine = prop.get("engine", "Python")
        if engine == "MPI":  # ModelInfo.java configPerModelSettings
            prop["option.mpi_mode"] = "true"
        mpi = prop.get("option.mpi_mode", "false").lower() == "true"
    # ConfigManager.java: SERVING_X is the server default; the model's own batch_size wins.
    batch_size = int(prop.get("batch_size", env.get("SERVING_BATCH_SIZE", "1")))
    options = {k.removeprefix("option."): v for k, v in prop.items() if k.startswith("option.")}
    tp = int(options.get("tensor_parallel_degree", "-1"))
    if mpi and tp > gpus:
        raise StartupError(f"GPU devices are not enough to run {tp} partitions.")  # PyModel.java
    entry_point = _entry_point(version, engine, options, files, env)
    weights = options.get("model_id") or (MODEL_STORE if url == MODEL_STORE else url)
    model = LoadedModel(url=url, engine=engine, mpi=mpi, entry_point=entry_point, backend="pipeline",
                        paged_attention=False, device_map=None, weights=weights,
                        revision=options.get("revision"), batch_size=batch_size, options=options, version=version)
    if entry_point == "djl_python.lmi_vllm.vllm_async_service":
        _vllm_async(version, model)
    elif version == "0.23.0":
        config = _config(files, prop, hub_configs, config_from_model_id=True)
        _huggingface_023(model, config, tp, gpus)
    else:
        _huggingface_033(version, model, tp)
    return model


def _entry_point(version: str, engine: str, options: Mapping[str, str], files: Mapping[str, str],
                 env: Mapping[str, str]) -> str:
    """engines/python/src/main/java/ai/djl/python/engine/PyModel.java load().

    option.entryPoint, else DJL_ENTRY_POINT, else a model.py, else: 0.23: djl_python.deepspeed for DeepSpeed,
    djl_python.huggingface when option.model_id is set, else FileNotFoundError. 0.33: with the vllm feature the
    vLLM async service (async mode forced on). 0.35+: with the vllm feature the async service only in async mode
    (option.async_mode), else djl_python.huggingface.
    """
    if "entryPoint" in options:
        return options["entryPoint"]
    if "DJL_ENTRY_POINT" in env:
        return env["DJL_ENTRY_POINT"]
    if "model.py" in files:
        return "model.py"
    if version == "0.23.0":
        if engine == "DeepSpeed":
            return "djl_python.deepspeed"
        if "model_id" in options:
            return "djl_python.huggingface"
        raise StartupError(".py file not found in the model folder")
    features = env.get("SERVING_FEATURES", "")
    if "vllm" in features:
        if version == "0.33.0" or options.get("async_mode", "false").lower() == "true":
            return "djl_python.lmi_vllm.vllm_async_service"
        return "djl_python.huggingface"
    if "model_id" in options or "config.json" in files:
        return "djl_python.huggingface"
    raise StartupError(".py file not found in the model folder")


# --- the Python side ---------------------------------------------------------------------------------------

def _huggingface_023(model: LoadedModel, config: dict | None, tp: int, gpus: int) -> None:
    """0.23.0-dlc engines/python/setup/djl_python/huggingface.py initialize().

    device_map: option.device_map, else "auto" when tensor_parallel_degree > 0 and a GPU is visible (then the
    visible GPU count must equal the degree). Rolling batch: `is_mpi` is `properties["engine"] != "Python"`,
    where properties are the option.* keys (so option.engine, i.e. OPTION_ENGINE in 0.23); get_rolling_batch_
    class_from_str: auto -> lmi-dist only for LMI_DIST_ADV_MODEL architectures with is_mpi, else scheduler.
    rolling_batch/lmi_dist_rolling_batch.py: option.paged_attention defaults to true, and get_model(sharded=TP > 1).
    How lmi-dist shards is closed source; the ranks it shards over are the processes DJL starts under mpirun
    (engines/python/.../Connection.java getPythonStartCmd), one per tensor-parallel rank, only in MPI mode.
    """
    options = model.options
    if "device_map" in options:
        model.device_map = options["device_map"]
    elif tp > 0 and gpus > 0:
        model.device_map = "auto"
    rolling = options.get("rolling_batch")
    if not rolling:
        return
    rolling = rolling.lower()
    is_mpi = options.get("engine") != "Python"
    if rolling == "auto":
        architecture = (config or {}).get("architectures", [""])[0]
        rolling = "lmi-dist" if architecture in LMI_DIST_ADV_MODEL_023 and is_mpi else "scheduler"
    if rolling not in ("lmi-dist", "scheduler", "vllm"):
        raise StartupError(f"Invalid rolling batch type: {rolling}")
    model.backend = rolling
    if rolling == "lmi-dist":
        model.paged_attention = options.get("paged_attention", "true").lower() == "true"
        if tp > 1 and not model.mpi:
            raise StartupError("lmi-dist with tensor_parallel_degree > 1 needs the MPI launch (option.mpi_mode)")


def _huggingface_033(version: str, model: LoadedModel, tp: int) -> None:
    """0.33.0-dlc+ engines/python/setup/djl_python/properties_manager/hf_properties.py and huggingface.py.

    rolling_batch must be a RollingBatchEnum value (0.35+ dropped lmi-dist and tnx); with rolling batch on,
    huggingface.py builds VLLMRollingBatch. construct_kwargs_device_map: option.device_map, else "auto" only when
    tensor_parallel_degree > 0 AND rolling batch is enabled; otherwise the pipeline loads on one device.
    """
    options = model.options
    allowed = {"vllm", "auto", "disable", "trtllm"} | ({"tnx", "lmi-dist"} if version == "0.33.0" else set())
    rolling = options.get("rolling_batch", "auto")
    if rolling not in allowed:
        raise StartupError(f"rolling_batch {rolling!r} is not a RollingBatchEnum value")
    enabled = rolling != "disable"
    if "device_map" in options:
        model.device_map = options["device_map"]
    elif tp > 0 and enabled:
        model.device_map = "auto"
    if enabled:
        model.backend = "vllm"
        model.paged_attention = True


def _vllm_async(version: str, model: LoadedModel) -> None:
    """engines/python/setup/djl_python/lmi_vllm/vllm_async_service.py (0.33.0-dlc+): vLLM's AsyncLLMEngine with
    VllmRbProperties. It starts whatever batch_size says; a batch of more than one fails per request (answer()).
    """
    model.backend = "vllm-async"
    model.paged_attention = True


# VllmRbProperties and its Properties base (properties_manager/vllm_rb_properties.py, properties.py): options that
# are DJL fields, not pass-through extras, even where vLLM has an argument of the same name.
DJL_FIELDS = {"model_id", "revision", "trust_remote_code", "dtype", "tensor_parallel_degree",
              "pipeline_parallel_degree", "max_rolling_batch_size", "max_rolling_batch_prefill_tokens", "quantize",
              "cpu_offload_gb_per_gpu", "max_loras", "enable_lora", "task", "device", "rolling_batch", "engine"}


def vllm_engine_arguments(model: LoadedModel, engine_args: Collection[str],
                          store_boolean: Collection[str] = ()) -> dict[str, str]:
    """What vLLM's parser receives, as {name: value} (properties_manager/vllm_rb_properties.py at each branch).

    generate_vllm_engine_arg_dict: tensor_parallel_degree -> tensor_parallel_size, max_rolling_batch_size ->
    max_num_seqs, max_rolling_batch_prefill_tokens -> max_num_batched_tokens, dtype through DTYPE_MAPPER, plus DJL's
    own defaults (0.33.0-dlc also use_v2_block_manager and device; 0.36.0-lmi27-dlc also runner and convert).
    get_additional_vllm_engine_args: every other option that is a vLLM EngineArgs field (engine_args: the names of
    the branch's vLLM, BRANCH_VLLM) passes through; other names are dropped. construct_vllm_args_list: a value
    "false" becomes `--no-x` (0.36.0-lmi27-dlc), `--x=false` for vLLM's StoreBoolean flags (0.33.0-dlc,
    store_boolean), and nothing otherwise (0.33.0-dlc's other flags, 0.35.0-dlc).
    """
    dtype = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32", "auto": "auto"}
    options = model.options
    arguments = {"model": model.weights, "tensor_parallel_size": options.get("tensor_parallel_degree", "1"),
                 "pipeline_parallel_size": "1", "max_num_seqs": options.get("max_rolling_batch_size", "32"),
                 "dtype": dtype[options.get("dtype", "auto")], "max_loras": "4", "enable_lora": "false",
                 "trust_remote_code": options.get("trust_remote_code", "false"), "cpu_offload_gb": "0.0",
                 "quantization": "None"}
    if model.revision:
        arguments["revision"] = model.revision
    if model.version == "0.33.0":
        arguments.update({"use_v2_block_manager": "true", "device": "auto"})
    if model.version == "0.36.0-lmi27":
        arguments.update({"runner": "auto", "convert": "auto"})
    if "max_rolling_batch_prefill_tokens" in options:
        arguments["max_num_batched_tokens"] = options["max_rolling_batch_prefill_tokens"]
    arguments.update({k: v for k, v in options.items() if k in engine_args and k not in DJL_FIELDS})
    for name, value in list(arguments.items()):
        if value.lower() != "false":
            continue
        if model.version == "0.33.0" and name in store_boolean:
            continue  # `--name=false`
        if model.version in ("0.33.0", "0.35.0"):
            del arguments[name]  # a false flag never reaches vLLM
    return arguments
