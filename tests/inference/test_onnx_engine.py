"""ONNX Runtime as a gate choice (issue 35): package-time export, the gate over (engine, precision) pairs, the
server's choice and its override, and the fallbacks to torch, on tiny random models built here (no downloads).

Architectures: RoBERTa (the repository's tiny model), BERT (its inputs include token_type_ids), DistilBERT (no
token types) and DeBERTa-v3 (DebertaV2 with relative attention, position buckets and no token types, so its graph
drops token_type_ids), each exported by `inference.sentiment.onnx_export` and measured by the gate.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import shutil
import tarfile
import threading
from pathlib import Path

import pytest

from inference.sentiment import accuracy_check, int8_target, onnx_engine, onnx_export
from inference.sentiment import precision as precisions
from inference.sentiment.cpu_features import Bf16Support
from inference.sentiment.precision import Figures, PrecisionRefused

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "training" / "data" / "sample" / "train.jsonl"
BF16_CPU = Bf16Support(True, "x86_64: all 2 processors have avx512_bf16", "x86_64")
LABELS = {"id2label": {0: "negative", 1: "neutral", 2: "positive"},
          "label2id": {"negative": 0, "neutral": 1, "positive": 2}}
TINY = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 128,
        "max_position_embeddings": 128}


def _texts() -> list[str]:
    return [json.loads(line)["text"] for line in SAMPLE.read_text().splitlines() if line.strip()]


def build_tiny(architecture: str, directory: Path, roberta_dir: Path) -> Path:
    """A random-weight 3-class classifier of `architecture` with a tokenizer trained on the sample, saved."""
    import torch
    import transformers
    from tokenizers import BertWordPieceTokenizer

    if architecture == "roberta":
        shutil.copytree(roberta_dir, directory)
        return directory
    wordpiece = BertWordPieceTokenizer(lowercase=True)
    wordpiece.train_from_iterator(_texts(), vocab_size=800, min_frequency=1, show_progress=False,
                                  special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    torch.manual_seed(0)
    if architecture == "bert":
        tokenizer = transformers.BertTokenizerFast(tokenizer_object=wordpiece._tokenizer, model_max_length=128)
        config = transformers.BertConfig(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, **TINY,
                                         **LABELS)
        model = transformers.BertForSequenceClassification(config)
    elif architecture == "distilbert":
        tokenizer = transformers.DistilBertTokenizerFast(tokenizer_object=wordpiece._tokenizer, model_max_length=128)
        config = transformers.DistilBertConfig(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                                               dim=64, n_layers=2, n_heads=2, hidden_dim=128,
                                               max_position_embeddings=128, **LABELS)
        model = transformers.DistilBertForSequenceClassification(config)
    else:  # DeBERTa-v3's shape (microsoft/deberta-v3-base's config keys), tiny
        tokenizer = transformers.PreTrainedTokenizerFast(
            tokenizer_object=wordpiece._tokenizer, model_max_length=128, pad_token="[PAD]", cls_token="[CLS]",
            sep_token="[SEP]", unk_token="[UNK]", mask_token="[MASK]",
            model_input_names=["input_ids", "token_type_ids", "attention_mask"])
        config = transformers.DebertaV2Config(
            vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, relative_attention=True,
            position_buckets=32, norm_rel_ebd="layer_norm", share_att_key=True, pos_att_type=["p2c", "c2p"],
            position_biased_input=False, max_relative_positions=-1, type_vocab_size=0, **TINY, **LABELS)
        model = transformers.DebertaV2ForSequenceClassification(config)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def exported_dir(model_dir, tmp_path_factory) -> Path:
    """The tiny RoBERTa with its onnx/ graphs beside it, as an archive made by training.package carries them."""
    directory = tmp_path_factory.mktemp("exported") / "model"
    shutil.copytree(model_dir, directory)
    manifest = onnx_export.export(directory, directory / onnx_engine.ONNX_DIR, int8_target=GRAVITON)
    assert set(manifest["graphs"]) == {"onnx-fp32", "onnx-int8"}, manifest  # the fast-math pair runs fp32's
    return directory


GRAVITON = int8_target.for_instance_type(int8_target.DEFAULT_TARGET)


def write_record(directory: Path, figures: list[Figures], measured_on: dict | None = None) -> None:
    record = precisions.make_record(figures, measured_on=measured_on)
    (directory / precisions.RECORD).write_text(json.dumps(record))


def all_pass(int8_onnx=(1.0, 0.004, 30.0)) -> list[Figures]:
    return [Figures("fp32", 1.0, 0.0, 240.0), Figures("bf16", 1.0, 0.002, 60.0), Figures("int8", 1.0, 0.005, 90.0),
            Figures("onnx-fp32", 1.0, 0.0, 100.0), Figures("onnx-int8", *int8_onnx)]


# transformers' DeBERTa module decorates helpers with torch.jit.script, which torch 2.13 calls deprecated on import
@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
@pytest.mark.parametrize("architecture", ["roberta", "bert", "distilbert", "deberta-v3"])
def test_each_architecture_exports_with_dynamic_axes_and_its_onnx_pairs_pass_the_gate(architecture, model_dir,
                                                                                     exported_dir, tmp_path):
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    if architecture == "roberta":  # the module's exported_dir is that export: the same model, the same call
        directory = exported_dir
        manifest = json.loads((directory / "onnx" / "export.json").read_text())
    else:
        directory = build_tiny(architecture, tmp_path / architecture, model_dir)
        manifest = onnx_export.export(directory, directory / "onnx", int8_target=GRAVITON)
    assert manifest.get("error") is None and manifest["errors"] == {}, manifest
    assert set(manifest["graphs"]) == {"onnx-fp32", "onnx-int8"}
    assert manifest["versions"]["onnxruntime"] == "1.32.0" and manifest["opset"] == 18
    assert manifest["exporter"] == "torch.onnx.export (torch.export-based, dynamo=True)"  # the maintained one
    assert manifest["fp32_max_logit_difference"] < 1e-5  # the graph is the model, not the model with dropout
    assert json.loads((directory / "onnx" / "export.json").read_text()) == manifest
    # Dynamic batch and sequence axes: other shapes than the export's example give torch's logits.
    tokenizer = AutoTokenizer.from_pretrained(directory)
    model = AutoModelForSequenceClassification.from_pretrained(directory).eval()
    engine = onnx_engine.OnnxClassifier(directory / "onnx" / "model.fp32.onnx", threads=1)
    for texts in (_texts()[:3], ["one text that is a good deal longer than the others, " * 3]):
        batch = tokenizer(texts, padding=True, return_tensors="pt")
        with torch.inference_mode():
            expected = model(**batch).logits
        assert torch.allclose(engine(**batch).logits, expected, atol=1e-4)
    # The gate measures both ONNX Runtime pairs against torch fp32 on held-out text of many lengths.
    figures = {entry.precision: entry for entry in accuracy_check.measure(
        directory, ("fp32", "onnx-fp32", "onnx-int8"), texts=accuracy_check.sample_texts()[:24], rounds=1)}
    assert figures["onnx-fp32"].passed() and figures["onnx-fp32"].max_change < 1e-4, figures["onnx-fp32"]
    assert figures["onnx-int8"].error is None and figures["onnx-int8"].ms_per_batch > 0


def test_the_int8_graph_has_8_bit_weights_for_graviton_and_7_bit_for_x86_without_vnni(exported_dir, tmp_path):
    """What ONNX Runtime's quantizer wrote, read back from the graphs: an archive for ml.c7g carries full-range
    weights; one for ml.c5 (may land on Skylake, no VNNI) keeps them within 7 bits."""
    graphs = {}
    onnx_dir = exported_dir / onnx_engine.ONNX_DIR  # exported for ml.c7g; its fp32 graph quantized again for ml.c5
    made = {"ml.c7g.4xlarge": json.loads((onnx_dir / "export.json").read_text())["int8"]}
    made["ml.c5.xlarge"] = onnx_export.quantize_int8(onnx_dir / onnx_engine.GRAPHS["onnx-fp32"], tmp_path / "c5.onnx",
                                                     tmp_path, int8_target.for_instance_type("ml.c5.xlarge"))
    for instance_type, done in made.items():
        target = int8_target.for_instance_type(instance_type)
        assert (done["weight_bits"], done["target"]) == (target.weight_bits, instance_type)
        assert f"reduce_range={target.reduce_range})" in done["method"]
    graphs["ml.c7g.4xlarge"] = onnx_export.int8_weight_range(onnx_dir / onnx_engine.GRAPHS["onnx-int8"])
    graphs["ml.c5.xlarge"] = onnx_export.int8_weight_range(tmp_path / "c5.onnx")
    # Symmetric int8 weights: the full range reaches +-127; the reduced one stops at +-64 (ONNX Runtime's 7-bit).
    assert max(map(abs, graphs["ml.c7g.4xlarge"])) == 127, graphs
    assert max(map(abs, graphs["ml.c5.xlarge"])) <= 64, graphs


def test_int8_pre_processing_falls_back_without_symbolic_shapes_and_leaves_no_files_behind(model_dir, tmp_path,
                                                                                          monkeypatch):
    """Without auto_merge ONNX Runtime's symbolic shape inference gives up on DistilBERT's graph and dumps its
    partial model into the current directory: the export retries without it, in a scratch folder."""
    from onnxruntime.quantization import shape_inference

    directory = build_tiny("distilbert", tmp_path / "distilbert", model_dir)
    real = shape_inference.quant_pre_process

    def without_auto_merge(*args, **kwargs):
        return real(*args, **{**kwargs, "auto_merge": False})

    monkeypatch.setattr(shape_inference, "quant_pre_process", without_auto_merge)
    workdir = tmp_path / "cwd"
    workdir.mkdir()
    monkeypatch.chdir(workdir)
    manifest = onnx_export.export(directory, directory / "onnx", int8_target=GRAVITON)
    assert set(manifest["graphs"]) == {"onnx-fp32", "onnx-int8"}, manifest
    assert manifest["int8"]["pre_process"] == ("quant_pre_process(skip_symbolic_shape=True) after Exception: "
                                               "Incomplete symbolic shape inference")
    assert list(workdir.iterdir()) == []  # no sym_shape_infer_temp.onnx here


def test_a_model_whose_export_fails_still_packages_and_serves_on_torch(model_dir, tmp_path, monkeypatch, caplog):
    import torch

    from inference.sentiment.server import model as models
    from training import package

    def refuse(*args, **kwargs):
        raise torch.onnx.errors.UnsupportedOperatorError("aten::made_up", 17, None)

    monkeypatch.setattr(torch.onnx, "export", refuse)
    archive = tmp_path / "model.tar.gz"
    with caplog.at_level(logging.WARNING, logger="inference.sentiment.onnx_export"):
        package.build(model_dir, archive, gate_rounds=1)
    [line] = [record.getMessage() for record in caplog.records if "onnx export" in record.getMessage()]
    assert "failed, the model serves on torch: UnsupportedOperatorError" in line and "aten::made_up" in line
    record = package.read_archive_record(archive)
    assert not record["figures"]["onnx-fp32"]["passed"] and not record["figures"]["onnx-int8"]["passed"]
    assert "the export failed at packaging (UnsupportedOperatorError" in record["figures"]["onnx-fp32"]["error"]
    assert record["precision"] in ("fp32", "bf16", "int8")
    extracted = tmp_path / "opt-ml-model"
    with tarfile.open(archive) as tar:
        names = tar.getnames()
        tar.extractall(extracted, filter="data")
    assert "onnx/export.json" in names and "onnx/model.fp32.onnx" not in names
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="inference.sentiment.server.model"):
        loaded = models.load(extracted, threads=1)
    [why] = [record.getMessage() for record in caplog.records if record.getMessage().startswith("calibration: ")]
    assert "not run here: onnx-fp32: no onnx/model.fp32.onnx: the export failed at packaging (UnsupportedOperator" \
        in why  # the server's start-up line
    assert loaded.precision in ("fp32", "bf16", "int8") and isinstance(loaded.sentiment.model, torch.nn.Module)
    assert len(models.predict([models.encode(precisions_request(), loaded)], loaded)) == 1
    precisions.activate("fp32")


def precisions_request():
    from inference.sentiment import inference as handler

    return handler.Request(["lovely weather"])


def test_an_archive_from_before_onnx_serves_on_torch_and_says_why_the_onnx_pairs_did_not_run(extracted):
    """No onnx/ folder: the calibration runs torch's pairs only, and its line says why the others did not run."""
    from inference.sentiment import calibration
    from inference.sentiment.server import model as models

    assert not (extracted / "onnx").exists()
    done = calibration.calibrate(extracted, threads=1, cpu=BF16_CPU)
    assert [entry.precision for entry in done.figures] == ["fp32", "bf16", "int8"]
    assert "not run here: onnx-fp32: no onnx/model.fp32.onnx in the model" in done.line
    loaded = models.load(extracted, threads=1)
    assert loaded.precision in ("fp32", "bf16", "int8") and not isinstance(loaded.sentiment.model,
                                                                           onnx_engine.OnnxClassifier)
    precisions.activate("fp32")


def test_an_override_of_a_pair_the_archive_lacks_is_refused_and_a_bad_value_names_the_pairs(exported_dir, tmp_path):
    from inference.sentiment import calibration

    directory = tmp_path / "model"
    shutil.copytree(exported_dir, directory)
    (directory / "onnx" / "model.fp32.onnx").unlink()
    with pytest.raises(PrecisionRefused, match=r"SENTIMENT_PRECISION=onnx-fp32 \(ONNX Runtime fp32\) cannot run: "
                                               r"no onnx/model.fp32.onnx in the model"):
        calibration.candidates(directory, "onnx-fp32", BF16_CPU)
    with pytest.raises(ValueError, match=r"SENTIMENT_PRECISION='onnx-fp16' is not a precision; allowed: fp32, bf16, "
                                         r"int8, onnx-fp32, onnx-int8, onnx-bf16-fastmath \(fp32: torch fp32;"):
        calibration.candidates(directory, "onnx-fp16", BF16_CPU)


def test_the_settings_accept_the_onnx_pairs_and_name_the_allowed_values():
    from pydantic import ValidationError

    from settings.serving import SentimentSettings

    assert SentimentSettings(precision="onnx-int8").precision == "onnx-int8"
    with pytest.raises(ValidationError, match="onnx-fp32"):
        SentimentSettings(precision="onnx")


def test_the_onnx_engine_sits_behind_the_handlers_seam_one_session_per_replica(exported_dir):
    """What the server loads for an onnx pair answers through the handler's own batching, from several replica
    threads at once, like torch fp32 to 1e-4."""
    from inference.sentiment.server import model as models

    onnx = models.load(exported_dir, threads=1, precision_override="onnx-fp32", replicas=2)
    torch_fp32 = models.load(exported_dir, threads=1, precision_override="fp32")
    assert isinstance(onnx.sentiment.model, onnx_engine.OnnxClassifier) and onnx.sentiment.model.replicas == 2
    texts = accuracy_check.sample_texts()[:24]
    requests = [models.encode(handler_request(texts[start:start + 3]), onnx) for start in range(0, 24, 3)]
    expected = models.predict(requests, torch_fp32)
    answers: dict[int, list] = {}

    def replica(index: int) -> None:
        for _ in range(3):
            answers[index] = models.predict(requests, onnx)

    threads = [threading.Thread(target=replica, args=(index,)) for index in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    for got in answers.values():
        for got_rows, expected_rows in zip(got, expected, strict=True):
            for got_row, expected_row in zip(got_rows, expected_rows, strict=True):
                assert got_row["label"] == expected_row["label"]
                assert abs(got_row["score"] - expected_row["score"]) < 1e-4
    assert len(answers) == 2


def handler_request(texts, top_k=None):
    from inference.sentiment import inference as handler

    return handler.Request(texts, top_k)


def test_an_onnx_pair_whose_session_cannot_start_is_not_served_and_the_line_says_why(exported_dir, tmp_path,
                                                                                      caplog):
    from inference.sentiment.server import model as models

    directory = tmp_path / "model"
    shutil.copytree(exported_dir, directory)
    (directory / "onnx" / "model.int8.onnx").write_bytes(b"not a graph")
    with caplog.at_level(logging.INFO, logger="inference.sentiment.server.model"):
        loaded = models.load(directory, threads=1)
    assert loaded.precision != "onnx-int8"
    [line] = [record.getMessage() for record in caplog.records if record.getMessage().startswith("calibration: ")]
    assert "; onnx-int8 cannot run (" in line and f"calibration: serving {loaded.precision} " in line
    with pytest.raises(PrecisionRefused, match=r"SENTIMENT_PRECISION=onnx-int8 does not answer like fp32 on this "
                                               r"CPU: onnx-int8: not measured \("):
        models.load(directory, threads=1, precision_override="onnx-int8")  # an override does not fall back
    precisions.activate("fp32")


needs_image_venv = pytest.mark.skipif(
    not (REPO / ".venv-image" / "bin" / "python").is_file() and not os.environ.get("REQUIRE_SERVING_STACK"),
    reason="no .venv-image; run `make image-venv`",
)


@pytest.mark.servers
@needs_image_venv
def test_the_image_server_serves_an_onnx_pair_through_its_real_request_path(exported_dir, model_dir, tmp_path):
    """The exported model served from .venv-image (the image's packages) with SENTIMENT_PRECISION=onnx-fp32: the
    calibration checks it here and says so in one line, and it answers like the handler's torch fp32. (Packaging
    with the real gate and serving the calibration's choice: test_precision.py's image-server test.)"""
    from inference.sentiment import inference as handler
    from inference.sentiment.server import local

    directory = tmp_path / "model"
    shutil.copytree(exported_dir, directory)
    write_record(directory, all_pass())
    texts = ["lovely weather", "terrible service, never again", "the bus leaves at noon"]
    expected = handler.predict_fn(handler.Request(texts, top_k=3), handler.model_fn(str(model_dir)))
    with local.LocalServer(directory, env={"SENTIMENT_PRECISION": "onnx-fp32"},
                           args=("--max-batch-wait-ms", "100")) as server:
        assert any(line.startswith("serving ") and "precision onnx-fp32," in line for line in server.lines)
        [why] = [line for line in server.lines if " calibration: serving onnx-fp32 " in line]
        assert "SENTIMENT_PRECISION=onnx-fp32, which answers like fp32 here" in why
        answers: dict[int, object] = {}

        def client(index: int) -> None:  # concurrent clients: their requests share the server's batches
            connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
            try:
                body = json.dumps({"inputs": [texts[index]], "parameters": {"top_k": 3}})
                connection.request("POST", "/invocations", body=body, headers={"Content-Type": "application/json"})
                response = connection.getresponse()
                answers[index] = (response.status, json.loads(response.read()))
            finally:
                connection.close()

        clients = [threading.Thread(target=client, args=(index,)) for index in range(len(texts))]
        for thread in clients:
            thread.start()
        for thread in clients:
            thread.join(60)
    for index, expected_rows in enumerate(expected):
        status, [rows] = answers[index]
        assert status == 200
        assert [row["label"] for row in rows] == [row["label"] for row in expected_rows]
        assert all(abs(got["score"] - want["score"]) < 1e-4 for got, want in zip(rows, expected_rows, strict=True))


# The variables by which ONNX Runtime 1.32.0 decides it runs in CI and then collects nothing (the names sit next to each
# other in its `onnxruntime_pybind11_state` module's strings; microsoft/onnxruntime#27379 "IsRunningInCI"). Our CI sets
# CI=true, so the control below takes them out to see what a user's machine or an endpoint would get.
CI_MARKERS = ("CI", "TF_BUILD", "GITHUB_ACTIONS", "GITLAB_CI", "CIRCLECI", "TRAVIS", "JENKINS_URL",
              "CODEBUILD_BUILD_ID", "BUILDKITE", "TEAMCITY_VERSION", "APPVEYOR", "BITBUCKET_BUILD_NUMBER")


def _files_after_import(tmp_path: Path, name: str, code: str, environment: dict[str, str]) -> list[str]:
    """Every file a fresh interpreter leaves in its own empty HOME and TMPDIR after running `code`."""
    import subprocess
    import sys

    home, temp = tmp_path / name / "home", tmp_path / name / "tmp"
    home.mkdir(parents=True)
    temp.mkdir()
    env = {key: value for key, value in os.environ.items()
           if key != onnx_engine.TELEMETRY_ENV and key not in CI_MARKERS}
    env |= {"HOME": str(home), "TMPDIR": str(temp), **environment}
    subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, check=True, timeout=120)
    return sorted(str(path.relative_to(tmp_path / name)) for path in (tmp_path / name).rglob("*") if path.is_file())


def test_onnx_runtime_telemetry_is_off_wherever_our_code_imports_it(tmp_path):
    """ONNX Runtime 1.32.0's own behaviour on a plain import (the control): a device id and an event database in the
    home directory and a `.ses` file in TMPDIR, its usage telemetry. Through `onnx_engine.import_runtime`, with a
    session built and run as the server builds it, nothing is written."""
    plain = _files_after_import(tmp_path, "plain", "import onnxruntime", {})
    assert "tmp/.ses" in plain and any(path.endswith("deviceid") for path in plain), plain
    ours = ("from inference.sentiment.image_check import matmul_graph, ONNX_PROVIDER\n"
            "from inference.sentiment.onnx_engine import import_runtime\n"
            "ort = import_runtime()\n"
            "import numpy\n"
            "session = ort.InferenceSession(matmul_graph(), providers=[ONNX_PROVIDER])\n"
            "session.run(None, {session.get_inputs()[0].name: numpy.ones((2, 8), numpy.float32)})\n"
            "import_runtime('onnxruntime.quantization')\n")
    assert _files_after_import(tmp_path, "ours", ours, {}) == []
    # A user who sets the variable themselves keeps their choice.
    assert "tmp/.ses" in _files_after_import(tmp_path, "opted-in", ours, {onnx_engine.TELEMETRY_ENV: "0"})


def test_the_exporters_unactionable_notes_are_dropped_by_message_and_only_during_an_export(caplog):
    """The two messages the dynamo exporter's libraries log on every export (onnx_export.EXPORTER_NOTES); any other
    warning of the same loggers still shows, and outside an export nothing is filtered."""
    with caplog.at_level(logging.WARNING):
        for name, start in onnx_export.EXPORTER_NOTES.items():
            logger = logging.getLogger(name)
            with onnx_export._without_exporter_notes():
                logger.warning(start, "LayerNormalization")
                logger.warning("something else from %s", name)
            logger.warning(start, "outside")
    messages = [record.getMessage() for record in caplog.records]
    assert messages == [line for name in onnx_export.EXPORTER_NOTES
                        for line in (f"something else from {name}", onnx_export.EXPORTER_NOTES[name] % "outside")]
