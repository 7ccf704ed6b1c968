"""Package-time ONNX export: an fp32 graph and a dynamically quantised int8 graph of a saved classifier.

`training.package` calls `export(model_dir, onnx_dir)` before the accuracy gate; the gate then measures the
graphs as the ONNX Runtime pairs (`onnx-fp32`, `onnx-int8`) beside torch's, and the archive carries them in
`onnx/` with `onnx/export.json`: what was exported, with which versions, and why anything was not. A model that
does not export still packages and serves on torch: `export` never raises for the model's sake, it records the
reason and logs it in one line (`LOG`), and the gate then fails that pair "not measured".

How:
- fp32: `torch.onnx.export(..., dynamo=True, opset_version=18)`, the maintained torch.export-based exporter (it
  needs onnxscript, pinned in training/requirements.txt; torch 2.13 deprecates the TorchScript-based one). Checked
  on the four architectures the gate covers (tests/inference/test_onnx_engine.py: RoBERTa, BERT, DistilBERT,
  DeBERTa-v3): each exports with dynamic batch and sequence axes and gives torch's logits at other shapes.
  Inputs are the tokenizer's `model_input_names` that the model's forward takes (RoBERTa, DistilBERT: input_ids,
  attention_mask; BERT adds token_type_ids), int64; the output is `logits`. The weights stay inside the .onnx file
  (`external_data=False`: RoBERTa-base is far below ONNX's 2 GB limit, and the archive then holds one file per
  graph). The module is wrapped for export and the wrapper put in eval mode, so dropout is off in the graph.
- int8: ONNX Runtime's recommended pre-processing (`quant_pre_process`: symbolic shape inference, graph
  optimisation, ONNX shape inference), then `quantize_dynamic(..., weight_type=QuantType.QInt8, reduce_range=...)`:
  int8 weights, activations quantised per batch at run time. The weights are 8-bit, or 7-bit where the serving CPU's
  int8 kernel saturates (`inference.sentiment.int8_target`: x86 without VNNI); the packaging step names the serving
  CPU, and export.json's `int8` says which weights were made and for which target. Symbolic shape inference runs
  with `auto_merge`; if it still fails the pre-processing is retried without it (recorded in `int8.pre_process`).
- check: the fp32 graph is run once by ONNX Runtime on the export's own example batch and its largest logit
  difference from torch recorded (`fp32_max_logit_difference`); the gate's figures are what decide.

Needs `onnx`, `onnxscript` and `onnxruntime` (training/requirements.txt); the serving image needs only `onnxruntime`.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import logging
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

from inference.sentiment.int8_target import Int8Target
from inference.sentiment.onnx_engine import GRAPHS, MANIFEST, OUTPUT, import_runtime

LOG = logging.getLogger(__name__)
OPSET = 18
EXPORTER = "torch.onnx.export (torch.export-based, dynamo=True)"
# Texts of different lengths, so the example batch carries padding and a real attention mask.
EXAMPLE_TEXTS = ("An example text to trace the graph with, long enough to need some padding next to it.", "Short.")
EXAMPLE_MAX_TOKENS = 16

Progress = Callable[[str], None]


def _versions() -> dict[str, str]:
    import importlib.metadata

    found = {}
    for name in ("torch", "transformers", "onnx", "onnxscript", "onnxruntime"):
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = "not installed"
    return found


def _short(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0][:300]}" if text else type(error).__name__


def input_names(model, tokenizer) -> list[str]:
    """The tokenizer's inputs that the model's forward accepts, in the tokenizer's order."""
    accepted = set(inspect.signature(model.forward).parameters)
    names = [name for name in tokenizer.model_input_names if name in accepted]
    if "input_ids" not in names:
        raise ValueError(f"the tokenizer's inputs {tokenizer.model_input_names} give the model no input_ids")
    return names


def export_fp32(model, tokenizer, path: Path) -> tuple[list[str], float]:
    """Write the fp32 graph; return (its input names, its largest logit difference from torch on the example)."""
    import numpy
    import torch

    onnxruntime = import_runtime()

    from inference.sentiment.inference import max_input_length

    names = input_names(model, tokenizer)
    # Truncated like the handler truncates (a model trained with short inputs has few position embeddings).
    limit = min(EXAMPLE_MAX_TOKENS, max_input_length(tokenizer, model.config))
    example = tokenizer(list(EXAMPLE_TEXTS), padding=True, truncation=True, max_length=limit, return_tensors="pt")
    tensors = tuple(example[name].to(torch.int64) for name in names)

    class Logits(torch.nn.Module):
        """Positional inputs in, logits out: the graph's whole interface."""

        def __init__(self, classifier):
            super().__init__()
            self.classifier = classifier

        def forward(self, *inputs):
            return self.classifier(**dict(zip(names, inputs, strict=True))).logits

    wrapper = Logits(model).eval()
    batch, sequence = torch.export.Dim("batch"), torch.export.Dim("sequence")
    # One entry for forward's *inputs, holding each input's dynamic axes.
    dynamic = (tuple({0: batch, 1: sequence} for _ in names),)
    with warnings.catch_warnings(), _without_exporter_notes():
        warnings.simplefilter("ignore")  # torch.export's notes on the traced code, per layer
        torch.onnx.export(wrapper, tensors, str(path), dynamo=True, opset_version=OPSET, input_names=names,
                          output_names=[OUTPUT], dynamic_shapes=dynamic, external_data=False, verbose=False)
    model.eval()
    with torch.inference_mode():
        reference = model(**{name: tensor for name, tensor in zip(names, tensors, strict=True)}).logits.float()
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    # The exporter drops an input the graph never reads (DeBERTa-v3 without token types: token_type_ids).
    used = [entry.name for entry in session.get_inputs()]
    feed = {name: tensor.numpy() for name, tensor in zip(names, tensors, strict=True) if name in used}
    (logits,) = session.run([OUTPUT], feed)
    return used, float(numpy.abs(logits - reference.numpy()).max())


# Warnings the exporter's libraries log on every export that say nothing a user can act on, by logger: the start of
# the message, which is all a filter drops (`_without_exporter_notes`).
EXPORTER_NOTES = {
    # torch 2.13, torch/onnx/_internal/exporter/_registration.py (_get_overload): onnxscript's registry names
    # torchvision's detection ops, and the exporter warns for each when torchvision is not installed (we use none).
    "torch.onnx._internal.exporter._registration": "torchvision is not installed. Skipping %s",
    # onnxscript 0.7.2, onnxscript/optimizer/_constant_folding.py (FoldConstantsPass): a warning for every constant
    # node with several outputs it leaves unfolded (LayerNormalization's optional mean and inverse standard
    # deviation); the graph is correct.
    "onnxscript.optimizer._constant_folding": "Skipping constant folding for op %s with multiple outputs",
}


class _Note(logging.Filter):
    def __init__(self, start: str):
        super().__init__()
        self.start = start

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.start)


@contextlib.contextmanager
def _without_exporter_notes():
    notes = [(logging.getLogger(name), _Note(start)) for name, start in EXPORTER_NOTES.items()]
    for logger, note in notes:
        logger.addFilter(note)
    try:
        yield
    finally:
        for logger, note in notes:
            logger.removeFilter(note)


def quantize_int8(fp32_path: Path, path: Path, scratch: Path, target: Int8Target) -> dict:
    """Pre-process as ONNX Runtime recommends, then dynamic int8 with QInt8 weights of the target's width; returns
    what was done."""
    quantization = import_runtime("onnxruntime.quantization")
    QuantType, quantize_dynamic = quantization.QuantType, quantization.quantize_dynamic
    quant_pre_process = import_runtime("onnxruntime.quantization.shape_inference").quant_pre_process

    fp32_path, path, scratch = Path(fp32_path).resolve(), Path(path).resolve(), Path(scratch).resolve()
    prepared = scratch / "model.pre.onnx"
    done = {"method": f"quantize_dynamic(weight_type=QInt8, reduce_range={target.reduce_range}) after "
                      "quant_pre_process",
            "weight_bits": target.weight_bits, "target": target.target, "why": target.why}
    # In the scratch folder: symbolic shape inference that gives up saves its partial model as
    # sym_shape_infer_temp.onnx plus external data files into the current directory (onnxruntime 1.32.0,
    # onnxruntime/tools/symbolic_shape_infer.py, SymbolicShapeInference.infer_shapes).
    with contextlib.chdir(scratch):
        try:
            # auto_merge: symbolic shape inference merges conflicting symbolic dimensions instead of giving up (its
            # own advice, e.g. for BERT's and DistilBERT's attention masks)
            quant_pre_process(str(fp32_path), str(prepared), auto_merge=True)
            done["pre_process"] = "quant_pre_process(auto_merge=True)"
        except Exception as error:
            done["pre_process"] = f"quant_pre_process(skip_symbolic_shape=True) after {_short(error)}"
            quant_pre_process(str(fp32_path), str(prepared), skip_symbolic_shape=True)
        quantize_dynamic(str(prepared), str(path), weight_type=QuantType.QInt8, reduce_range=target.reduce_range)
    return done


def export(model_dir: Path, onnx_dir: Path, *, int8_target: Int8Target, progress: Progress | None = None) -> dict:
    """Export `model_dir`'s classifier into `onnx_dir` (fp32 and int8 graphs, the int8 weights made for
    `int8_target`, and export.json); returns the manifest. Never raises for the model's sake: a failure is recorded
    (`error` / `errors`) and logged."""
    say = progress or (lambda line: None)
    onnx_dir = Path(onnx_dir)
    onnx_dir.mkdir(parents=True, exist_ok=True)
    for name in (*dict.fromkeys(GRAPHS.values()), MANIFEST):  # the fast-math pair shares fp32's graph
        (onnx_dir / name).unlink(missing_ok=True)
    manifest: dict = {"exporter": EXPORTER, "opset": OPSET, "versions": _versions(), "graphs": {}, "errors": {}}
    started = time.perf_counter()
    fp32_path = onnx_dir / GRAPHS["onnx-fp32"]
    try:
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        say(f"onnx: exporting {model_dir} to {fp32_path.name} (opset {OPSET})")
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        model = AutoModelForSequenceClassification.from_pretrained(model_dir, dtype=torch.float32).eval()
        manifest["architecture"] = (model.config.architectures or [type(model).__name__])[0]
        names, difference = export_fp32(model, tokenizer, fp32_path)
        manifest.update(inputs=names, fp32_max_logit_difference=difference)
        manifest["graphs"]["onnx-fp32"] = GRAPHS["onnx-fp32"]
        del model
    except Exception as error:
        fp32_path.unlink(missing_ok=True)
        manifest["error"] = _short(error)
        manifest["seconds"] = round(time.perf_counter() - started, 1)
        _write(onnx_dir, manifest)
        LOG.warning("onnx export of %s failed, the model serves on torch: %s", model_dir, manifest["error"])
        return manifest
    say(f"onnx: fp32 graph written ({fp32_path.stat().st_size / 2**20:.1f} MiB, largest logit difference from "
        f"torch {difference:.2e}); quantizing to int8 with {int8_target.weight_bits}-bit weights for "
        f"{int8_target.target} ({int8_target.why})")
    int8_path = onnx_dir / GRAPHS["onnx-int8"]
    with tempfile.TemporaryDirectory(prefix="onnx-quant-") as scratch:
        try:
            manifest["int8"] = quantize_int8(fp32_path, int8_path, Path(scratch), int8_target)
            manifest["graphs"]["onnx-int8"] = GRAPHS["onnx-int8"]
        except Exception as error:
            int8_path.unlink(missing_ok=True)
            manifest["errors"]["onnx-int8"] = _short(error)
            LOG.warning("onnx int8 quantization of %s failed (the fp32 graph and torch still serve): %s", model_dir,
                        manifest["errors"]["onnx-int8"])
    manifest["seconds"] = round(time.perf_counter() - started, 1)
    _write(onnx_dir, manifest)
    say(f"onnx: exported {', '.join(manifest['graphs'])} in {manifest['seconds']} s")
    return manifest


def _write(onnx_dir: Path, manifest: dict) -> None:
    (onnx_dir / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")


def int8_weight_range(graph: Path) -> tuple[int, int]:
    """The smallest and largest value over the graph's int8 initializers (its quantized weights): symmetric 8-bit
    weights reach +-127, ONNX Runtime's 7-bit (`reduce_range`) ones stop at +-64."""
    import onnx
    from onnx import numpy_helper

    values = [numpy_helper.to_array(tensor) for tensor in onnx.load(str(graph)).graph.initializer
              if tensor.data_type == onnx.TensorProto.INT8 and tensor.dims]
    if not values:
        raise ValueError(f"{graph}: no int8 weights")
    return min(int(value.min()) for value in values), max(int(value.max()) for value in values)


def copy_graphs(source: Path, target: Path) -> None:
    """The exported files (graphs and manifest) from one folder into another."""
    target.mkdir(parents=True, exist_ok=True)
    for name in (*dict.fromkeys(GRAPHS.values()), MANIFEST):  # the fast-math pair shares fp32's graph
        if (source / name).is_file():
            shutil.copyfile(source / name, target / name)
