"""Per LMI container version: its image, what it bundles, the DJL Serving branch its rules were read from, and per
batching mode the engine, backend and fixed serving.properties keys that make the container do what the settings say.

DJL Serving's rules come from its release branches (github.com/deepjavalibrary/djl-serving, commit per branch
below); each rule names the file it comes from. tests/lmi_container.py encodes that code independently, and
tests/test_lmi_conformance.py runs every rendering through it. vLLM's own argument rules come from the vLLM sdist
of the version each image bundles (vllm_engine_args.py, generated; checked by inference.llm.lmi.vllm).

Two releases have no public DJL Serving source: 0.36.0-lmi28 and 0.38.0-lmi29 (the fetched snapshot of
djl-serving ends at branch 0.36.0-lmi27-dlc and master of 2026-06-24). For them the DJL rules of 0.36.0-lmi27 are
assumed and the vLLM arguments are checked against the vLLM their release data names
(docs/falcon-lmi.md, "LMI versions").

Dropped: 0.27.0 and 0.29.0 (lmi-dist 2 passes the prefill budget to vLLM as max_num_batched_tokens, and its
non-paged rolling batch is the scheduler backend: not the recipe's lmi-dist, and not checked end to end).
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
class Bundle:
    """What an image ships, and where that was read."""

    vllm: str | None  # the vLLM version the image installs (None: vLLM is not what serves our modes)
    transformers: str
    torch: str
    cuda: str
    source: str  # where these versions were read


@dataclass(frozen=True)
class ContainerVersion:
    version: str
    tag: str
    branch: str  # the DJL Serving branch whose code the rules come from
    commit: str  # that branch's commit as read, so drift is visible
    # OPTION_ENGINE selects the engine. 0.23 infers the engine before it merges OPTION_* into the model's
    # properties (wlm/.../ModelInfo.java configPerModelSettings); 0.27+ maps OPTION_ENGINE to `engine`
    # (ModelInfo.java loadServingProperties).
    engine_from_environment: bool
    trust_remote_code: bool
    backends: dict[str, Backend]
    bundle: Bundle
    refused: dict[str, str] = field(default_factory=dict)  # batching mode -> the real reason
    # The vLLM sdist whose EngineArgs and start-up checks are applied (vllm_engine_args.VLLM_SOURCES), and why.
    vllm_rules: str | None = None
    vllm_rules_note: str = ""
    # How DJL turns option.x=false into vLLM arguments (properties_manager/vllm_rb_properties.py
    # construct_vllm_args_list): "store_boolean" (0.33: `--x=false` only for vLLM's StoreBoolean flags, other
    # false flags dropped), "dropped" (0.35: every false flag dropped), "no_flag" (0.36 lmi27: `--no-x`).
    false_flags: str = "no_flag"
    public_source: bool = True  # False: DJL's code for this release is not public; `branch` is the nearest one

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
    "0.23.0", "0.23.0-deepspeed0.9.5-cu118", "0.23.0-dlc", "07673c54097d8a51bf6e526d3268b7d19e8b5425",
    engine_from_environment=False, trust_remote_code=True,
    bundle=Bundle(None, "4.30.2", "2.0.1", "11.8", "serving/docker/deepspeed.Dockerfile at 0.23.0-dlc (it also "
                  "installs vLLM 0.1.1, which no mode here uses)"),
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


def _vllm_era(version: str, tag: str, branch: str, commit: str, bundle: Bundle, vllm_rules: str,
              vllm_rules_note: str = "", false_flags: str = "no_flag", public_source: bool = True) -> ContainerVersion:
    return ContainerVersion(
        version, tag, branch, commit, engine_from_environment=True, trust_remote_code=False,
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
        bundle=bundle, refused={"rolling": _VLLM_REFUSAL.format(version=version)}, vllm_rules=vllm_rules,
        vllm_rules_note=vllm_rules_note, false_flags=false_flags, public_source=public_source)


_LMI27_COMMIT = "7e13b081383bd46293d4b49ab214d4757b1effd5"
_AWS_DATA = "github.com/aws/deep-learning-containers docs/src/data/djl-inference/"
VERSIONS: dict[str, ContainerVersion] = {v.version: v for v in (
    V0_23,
    _vllm_era("0.33.0", "0.33.0-lmi15.0.0-cu128", "0.33.0-dlc", "8b3b685b65f0ba1d89ce471c0f1cefc09dc36da2",
              Bundle("0.8.4", "4.51.3", "2.6.0", "12.8.1",
                     "serving/docker/lmi-container-requirements.txt and lmi.Dockerfile at 0.33.0-dlc; "
                     f"{_AWS_DATA}0.33-lmi15.0.0-gpu.yml"),
              vllm_rules="0.8.4", false_flags="store_boolean"),
    _vllm_era("0.35.0", "0.35.0-lmi17.0.0-cu128", "0.35.0-dlc", "637866135ee775bc1533808e843d7c32c8a2c179",
              Bundle("0.11.1", "4.57.1", "2.9.0", "12.8.1",
                     f"{_AWS_DATA}0.35-lmi17.0.0-gpu.yml (vLLM, from DJL's vllm_extensions_package wheel; the "
                     "branch's pyproject.toml still says vllm==0.10.2, but the image installs torch 2.9.0, which "
                     "0.11.1 needs); transformers, torch, CUDA: lmi-container-requirements.txt and lmi.Dockerfile"),
              vllm_rules="0.11.1", false_flags="dropped"),
    _vllm_era("0.36.0-lmi27", "0.36.0-lmi27.0.0-cu130", "0.36.0-lmi27-dlc", _LMI27_COMMIT,
              Bundle("0.23.1.dev4+gcd87ce883", ">=4.56.0,<=5.9.0", "2.11.0", "13.0.2",
                     "serving/docker/lmi-container-requirements.txt and lmi.Dockerfile at 0.36.0-lmi27-dlc (a DJL "
                     f"build of vLLM, 4 commits after a 0.23 tag); {_AWS_DATA}0.36-lmi27.0.0-gpu.yml says 0.23.1"),
              vllm_rules="0.23.0",
              vllm_rules_note="the image's vLLM is a DJL build (0.23.1.dev4+gcd87ce883) that is not on PyPI; "
                              "its arguments are checked against the 0.23.0 release it was built from"),
    _vllm_era("0.36.0-lmi28", "0.36.0-lmi28.0.0-cu130", "0.36.0-lmi27-dlc", _LMI27_COMMIT,
              Bundle("0.26.0", "unknown", "unknown", "13.0 (tag cu130)",
                     f"{_AWS_DATA}0.36-lmi28.0.0-gpu.yml (commit f68419c96a7009322e3bbdc9659b3509a72abf73); no "
                     "public DJL Serving source"),
              vllm_rules="0.26.0", public_source=False),
    _vllm_era("0.38.0-lmi29", "0.38.0-lmi29.0.0-cu130", "0.36.0-lmi27-dlc", _LMI27_COMMIT,
              Bundle("0.28.0", "unknown", "unknown", "13.0 (tag cu130)",
                     "the tag: sagemaker-core 2.27 image_uri_config/djl-lmi.json (its `latest`); vLLM 0.28 as "
                     "issue 22 states it, which no public source read here confirms"),
              vllm_rules="0.28.0",
              vllm_rules_note="the bundled vLLM version is not confirmed by a public source", public_source=False),
)}
# New environments: the newest release whose DJL Serving code is public and whose vLLM arguments are checked.
DEFAULT_VERSION = "0.36.0-lmi27"
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
