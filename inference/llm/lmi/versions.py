"""Per LMI container version: its image, the DJL Serving branch its rules were read from, and per batching mode
the engine, backend and fixed serving.properties keys that make the container do what the settings say.

Only versions whose DJL Serving release branch was read are offered (github.com/deepjavalibrary/djl-serving);
each rule below names the file it comes from. tests/lmi_container.py encodes that code independently, and
tests/test_lmi_conformance.py runs every rendering through it.

Dropped: 0.27.0 and 0.29.0 (lmi-dist 2 passes the prefill budget to vLLM as max_num_batched_tokens, and its
non-paged rolling batch is the scheduler backend: not the recipe's lmi-dist, and not checked end to end);
0.38.0 (in the SageMaker SDK's djl-lmi table, but DJL Serving's public source has no 0.38 release to read).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from settings import SettingsError

REPOSITORY = "djl-inference"
SOURCE = "github.com/deepjavalibrary/djl-serving"

# Engines as the memory sizing knows them.
ACCELERATE = "accelerate"  # HF accelerate: transformers generate, layers placed across GPUs by device_map
LMI_DIST = "lmi-dist"  # LMI 0.23's lmi-dist (TGI-derived), true tensor parallelism under MPI
VLLM = "vllm"  # vLLM's engine through LMI's async service, true tensor parallelism


@dataclass(frozen=True)
class Backend:
    """What serves one batching mode: DJL engine, the model server's Python side, and its fixed keys."""

    engine: str  # DJL engine the model runs under: Python or MPI
    runtime: str  # ACCELERATE, LMI_DIST or VLLM
    paged: bool
    properties: dict[str, str]
    summary: str  # for the README table and the CLI


@dataclass(frozen=True)
class ContainerVersion:
    version: str
    tag: str
    branch: str  # the DJL Serving branch read
    # OPTION_ENGINE selects the engine. 0.23 infers the engine before it merges OPTION_* into the model's
    # properties (wlm/.../ModelInfo.java configPerModelSettings); 0.27+ maps OPTION_ENGINE to `engine`
    # (ModelInfo.java loadServingProperties).
    engine_from_environment: bool
    trust_remote_code: bool
    backends: dict[str, Backend]
    refused: dict[str, str] = field(default_factory=dict)  # batching mode -> the real reason

    @property
    def chunked_prefill(self) -> bool:
        return any(b.runtime == VLLM for b in self.backends.values())


# LMI 0.23 (the recipe's). Dynamic: huggingface.py builds a transformers pipeline. Rolling:
# huggingface.py get_rolling_batch_class_from_str sends `auto` to lmi-dist only for RWForCausalLM (Falcon's
# config on the hub now says FalconForCausalLM, added to that list in 0.24), so lmi-dist is named. lmi-dist
# shards with torch.distributed under mpirun, which the Python engine starts only with option.mpi_mode=true
# (engines/python/.../PyModel.java) or engine=MPI (MpiEngineProvider). It reads option.paged_attention
# (rolling_batch/lmi_dist_rolling_batch.py, default true).
_V023_ROLLING = {"option.mpi_mode": "true", "option.rolling_batch": "lmi-dist"}
V0_23 = ContainerVersion(
    "0.23.0", "0.23.0-deepspeed0.9.5-cu118", "0.23.0-dlc", engine_from_environment=False,
    trust_remote_code=True,
    backends={
        "dynamic": Backend("Python", ACCELERATE, False, {"option.device_map": "auto"},
                           "transformers pipeline, layers spread over the GPUs by accelerate (device_map=auto)"),
        "rolling": Backend("MPI", LMI_DIST, False, {**_V023_ROLLING, "option.paged_attention": "false"},
                           "lmi-dist under MPI, tensor parallel, PagedAttention off"),
        "rolling_paged": Backend("MPI", LMI_DIST, True, {**_V023_ROLLING, "option.paged_attention": "true"},
                                 "lmi-dist under MPI, tensor parallel, PagedAttention on"),
    })

# LMI 0.33 and later: the image sets SERVING_FEATURES=vllm (serving/docker/lmi.Dockerfile). Without an
# entry point 0.33 always starts djl_python.lmi_vllm.vllm_async_service, which takes one request per batch
# (PyModel.java; vllm_async_service.py), and 0.35+ start huggingface.py unless async mode is on. So both modes
# name their entry point. Dynamic batching: rolling_batch=disable, and device_map=auto, which
# properties_manager/hf_properties.py sets only when rolling batch is on.
_VLLM_REFUSAL = ("dynamic or rolling_paged with lmi_version {version}: its only continuous-batching backend is "
                 "vLLM, which always pages the KV cache (continuous batching without PagedAttention is "
                 "lmi_version 0.23.0's lmi-dist)")


def _vllm_era(version: str, tag: str, branch: str) -> ContainerVersion:
    return ContainerVersion(
        version, tag, branch, engine_from_environment=True, trust_remote_code=False,
        backends={
            "dynamic": Backend("Python", ACCELERATE, False,
                               {"option.entryPoint": "djl_python.huggingface", "option.rolling_batch": "disable",
                                "option.device_map": "auto"},
                               "transformers pipeline, layers spread over the GPUs by accelerate (device_map=auto)"),
            "rolling_paged": Backend("Python", VLLM, True,
                                     {"option.entryPoint": "djl_python.lmi_vllm.vllm_async_service",
                                      "option.async_mode": "true", "option.rolling_batch": "vllm"},
                                     "vLLM (async service), tensor parallel, PagedAttention"),
        },
        refused={"rolling": _VLLM_REFUSAL.format(version=version)})


VERSIONS: dict[str, ContainerVersion] = {v.version: v for v in (
    V0_23,
    _vllm_era("0.33.0", "0.33.0-lmi15.0.0-cu128", "0.33.0-dlc"),
    _vllm_era("0.35.0", "0.35.0-lmi17.0.0-cu128", "0.35.0-dlc"),
    _vllm_era("0.36.0", "0.36.0-lmi27.0.0-cu130", "0.36.0-lmi27-dlc"),
)}
IMAGE_TAGS: dict[str, str] = {v.version: v.tag for v in VERSIONS.values()}


def container(lmi_version: str) -> ContainerVersion:
    try:
        return VERSIONS[lmi_version]
    except KeyError:
        raise SettingsError("falcon.lmi_version", lmi_version, "one of " + ", ".join(VERSIONS)) from None


def backend(lmi_version: str, batching: str) -> Backend:
    """The backend of a mode, or SettingsError with the real reason the version cannot run it."""
    spec = container(lmi_version)
    if batching in spec.refused:
        raise SettingsError("falcon.batching", batching, spec.refused[batching])
    return spec.backends[batching]
