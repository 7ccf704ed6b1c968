"""Our server against the Hugging Face toolkit's default, through real servers (`make bench-handler`).

Rows, each a real server started for its turn:
- `toolkit-default`: what a user of the Hugging Face inference toolkit gets, a transformers `pipeline` called
  once per request (`serving/hf_default_handler.py`), under TorchServe and the SageMaker toolkit of the retired
  image (`inference.sentiment.local_stack`; `make bench-handler` installs them with `make serving-stack`, and
  `--no-toolkit` leaves the row out);
- `server-fp32`: our server (`python -m inference.sentiment.server serve` from .venv-image: the image's entry
  point and pinned requirements) on the model.tar.gz `training.package` builds, forced to fp32;
- `server-<pair>`: the same forced to each other pair the packaging gate passed (`training.package` runs the gate,
  `inference.sentiment.accuracy_check`, while it builds the archive; bf16 only where this CPU has bf16
  instructions), the gate's own pick among them; `--precision` names the pick instead (the server refuses a pair
  that does not answer like fp32 on this CPU: status 1 here);
- `server-auto`: the same with no override, as an endpoint runs it: the pair its start-up calibration chose on this
  CPU (`inference.sentiment.calibration`; the servers' log has its line). It should be the fastest row at c8,
  within 5% (issue 44).

Scenarios: 1, 8 and 32 concurrent clients sending one text per request (`c1`, `c8`, `c32`), and one client
sending 8 and 32 texts per request (`b8`, `b32`); each client keeps one connection alive. Printed per row:
requests/s, texts/s, p50 and p99 latency, the useful GFLOP/s (each text's forward pass at its own token count,
from the model's config: padding not counted) against this machine's GEMM roof (one 2048x2048 matmul in bf16,
or in fp32 on a CPU without bf16 instructions,
measured in the same run before each round; the highest counts, as load from other work only lowers it), and
requests/s as a multiple of the toolkit row's.

Methods take turns (`--rounds`; each round starts each server once and times its share of every scenario), so
other load on a shared machine falls on every row alike. Figures are printed, never asserted.

`--mode rss` instead sends `--rss-requests` (default 10,000) single-text requests from 8 clients to our server at
the gate's precision and prints its resident memory every tenth of the way.

Without --model-dir it builds a random-weight classifier from a config (`--preset base`: RoBERTa-base's
12 x 768, the same model as `accuracy_check --random-model roberta-base`; `tiny`: 2 x 64, for tests) on a
tokenizer trained on the shipped sample. Nothing is downloaded.

Exit status: 0 done (also after SIGTERM, which stops the servers and ends early), 1 a server failed, 2 bad
arguments or model, 130 after Ctrl-C.

    python -m inference.sentiment.benchmark_server                     # RoBERTa-base, about 6-10 min on 2 cores
    python -m inference.sentiment.benchmark_server --preset tiny --requests 8 --rounds 1
    python -m inference.sentiment.benchmark_server --mode rss          # server RSS over 10,000 requests
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import random
import signal
import socket
import statistics
import sys
import tarfile
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from common import processes
from common.cli_types import non_negative_int, positive_int
from inference.sentiment import int8_target
from inference.sentiment.precision import PRECISIONS

PROG = "python -m inference.sentiment.benchmark_server"
BASELINE_HANDLER = Path(__file__).resolve().parent / "serving" / "hf_default_handler.py"
SAMPLE_DIR = Path(__file__).resolve().parents[2] / "training" / "data" / "sample"
# RoBERTa-base's shape, for `--preset base`.
BASE_SHAPE = {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072}
TOOLKIT = "toolkit-default"
# The row of our server started with no override: the pair its start-up calibration chose on this CPU.
AUTO = "server-auto"
# Within this share of the fastest row at c8, the auto row counts as the fastest (issue 44).
AUTO_TOLERANCE = 0.05
# (name, concurrent clients, texts per request)
SCENARIOS = (("c1", 1, 1), ("c8", 8, 1), ("c32", 32, 1), ("b8", 1, 8), ("b32", 1, 32))
GOAL_SCENARIO, GOAL_RATIO = "c8", 3.0
# Issue 35: the gate's best pair (an ONNX Runtime one, say) against the server's bf16 row of the same run.
BEST_OVER_BF16_RATIO = 1.3
RSS_CLIENTS = 8
TORCHSERVE_WAIT_S = 300
STOP_STATUS = {signal.SIGTERM: 0, signal.SIGINT: 130}


def say(*args) -> None:
    print(*args, flush=True)


# --- stopping ------------------------------------------------------------------------------------------------------

class Interrupted(BaseException):
    """SIGTERM or SIGINT: raised once in the main thread, so every `finally` stops its server."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class _StopState:
    received: int | None = None
    shield_depth = 0


def install_stop_handlers() -> dict:
    """The first SIGTERM/SIGINT raises Interrupted (at once, or when a `shielded()` block ends); later ones are
    ignored so they cannot break the clean-up. Returns the handlers it replaced, for `signal.signal` to put back.
    """
    _StopState.received = None

    def handle(signum, _frame):
        if _StopState.received is not None:
            return
        _StopState.received = signum
        if not _StopState.shield_depth:
            raise Interrupted(signum)

    return {signum: signal.signal(signum, handle) for signum in STOP_STATUS}


@contextlib.contextmanager
def shielded():
    """Stopping a server must finish (else a TorchServe could outlive us): a signal meanwhile is raised after it."""
    _StopState.shield_depth += 1
    try:
        yield
    finally:
        _StopState.shield_depth -= 1
    if not _StopState.shield_depth and _StopState.received is not None:
        raise Interrupted(_StopState.received)


def stop_server(server) -> None:
    with shielded():
        server.stop()


# --- model, work, precision ----------------------------------------------------------------------------------------

def sample_texts() -> list[str]:
    """Every text of the shipped sample, in file order."""
    texts = []
    for path in sorted(SAMPLE_DIR.glob("*.jsonl")):
        texts += [json.loads(line)["text"] for line in path.read_text().splitlines() if line.strip()]
    return texts


def make_batches(texts: list[str], batch_size: int, count: int, seed: int) -> list[list[str]]:
    """`count` batches of tweet-like texts of one to four sample sentences, so lengths and padding vary."""
    rng = random.Random(seed * 1000 + batch_size)
    return [[" ".join(rng.sample(texts, rng.choice((1, 1, 2, 3, 4)))) for _ in range(batch_size)]
            for _ in range(count)]


def build_model_dir(directory: Path, preset: str) -> Path:
    """A random-weight classifier with the tiny tokenizer trained on the sample, saved like a trained model."""
    from training import tiny

    tokenizer = tiny.build_tokenizer(sample_texts())
    model = tiny.build_model(tokenizer)
    if preset == "base":
        from transformers import RobertaForSequenceClassification

        model.config.update(BASE_SHAPE)
        model = RobertaForSequenceClassification(model.config)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def text_flops(tokens: int, config) -> float:
    """Matrix FLOPs of one text's forward pass over `tokens` tokens: projections, feed-forward, attention, head."""
    d, ff, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    per_layer = 2 * tokens * (4 * d * d + 2 * d * ff) + 2 * 2 * tokens * tokens * d
    return layers * per_layer + 2 * (d * d + d * config.num_labels)


def gemm_roof(threads: int, dtype_name: str = "bf16", size: int = 2048, repeats: int = 5) -> float:
    """GFLOP/s of one size^3 matmul (median of `repeats`) with the servers' thread count."""
    import torch

    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype_name]
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a, b = torch.randn(size, size, dtype=dtype), torch.randn(size, size, dtype=dtype)
        torch.matmul(a, b)
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            torch.matmul(a, b)
            times.append(time.perf_counter() - started)
    finally:
        torch.set_num_threads(previous)
    return 2 * size ** 3 / statistics.median(times) / 1e9


def gate_record(archive: Path) -> dict:
    """The accuracy gate's record that `training.package` wrote into the archive (its own reader)."""
    from training import package

    record = package.read_archive_record(archive)
    if record is None:
        raise RuntimeError(f"{archive.name}: no {package.PRECISION_RECORD}; training.package ran no gate")
    return record


# --- load ----------------------------------------------------------------------------------------------------------

@dataclass
class Timing:
    """One row of one scenario, pooled over rounds."""

    latencies: list[float] = field(default_factory=list)
    elapsed: float = 0.0
    texts: int = 0
    flops: float = 0.0

    @property
    def requests(self) -> int:
        return len(self.latencies)

    @property
    def rate(self) -> float:
        return self.requests / self.elapsed

    def percentile(self, q: int) -> float:
        if len(self.latencies) == 1:
            return self.latencies[0]
        return statistics.quantiles(self.latencies, n=100, method="inclusive")[q - 1]


def run_load(port: int, bodies: list[bytes], concurrency: int) -> tuple[list[float], float]:
    """Send every body, `concurrency` clients at a time on keep-alive connections: (latencies, wall seconds).

    Any answer other than 200 stops the clients and raises RuntimeError.
    """
    latencies: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    pending = list(reversed(bodies))

    def client() -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
        try:
            while True:
                with lock:
                    if not pending or errors:
                        return
                    body = pending.pop()
                started = time.perf_counter()
                connection.request("POST", "/invocations", body=body, headers={"Content-Type": "application/json"})
                response = connection.getresponse()
                answer = response.read()
                elapsed = time.perf_counter() - started
                with lock:
                    if response.status != 200:
                        errors.append(f"status {response.status}: {answer[:200]!r}")
                        return
                    latencies.append(elapsed)
        except (OSError, http.client.HTTPException) as error:
            with lock:
                errors.append(f"{type(error).__name__}: {error}")
        finally:
            connection.close()

    threads = [threading.Thread(target=client, daemon=True) for _ in range(min(concurrency, len(bodies)))]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    if errors:
        raise RuntimeError(f"port {port}: {errors[0]}")
    return latencies, elapsed


def body(texts: list[str]) -> bytes:
    return json.dumps({"inputs": texts[0] if len(texts) == 1 else texts}).encode()


# --- methods -------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Method:
    name: str
    precision: str | None = None  # None: the toolkit default

    def start(self, archives: dict[str, Path], log: Path, workers: int):
        """A started server (stopped by its `stop()`), with `.port` and `.process`; every row gets `workers`
        workers (TorchServe's processes; our server's model replicas, threads of its one process), with threads
        from the same formula (inference.sentiment.container.worker_threads)."""
        if self.precision is None:
            from inference.sentiment.local_stack import LocalStack

            wait_for_other_torchserve()
            return LocalStack(archives["toolkit"], workers=workers, log=log).start()
        from inference.sentiment.server.local import LocalServer

        override = () if self.name == AUTO else ("--precision", self.precision)
        return LocalServer(archives["server"], args=(*override, "--workers", str(workers)), log=log).start()


def wait_for_other_torchserve(timeout: float = TORCHSERVE_WAIT_S, poll: float = 2.0) -> None:
    """The toolkit allows one TorchServe per machine; on a shared machine another run's may be up for a while."""
    from inference.sentiment.local_stack import torchserve_pids

    deadline = time.monotonic() + timeout
    running = torchserve_pids()
    if running:
        say(f"  another TorchServe runs here (pid {', '.join(map(str, running))}); waiting up to {timeout:.0f} s "
            "for it to end (the toolkit allows one per machine)")
    while running and time.monotonic() < deadline:
        time.sleep(poll)
        running = torchserve_pids()
    # Still running: LocalStack.start refuses with the pid, which ends the benchmark with status 1.


def server_pids(server_pid: int) -> list[int]:
    """Our server's processes: since issue 32 the one server process (its model replicas are threads); any
    children it has are counted too (Linux /proc)."""
    children = Path(f"/proc/{server_pid}/task/{server_pid}/children")
    return [server_pid, *(int(pid) for pid in children.read_text().split())] if children.exists() else [server_pid]


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"pid {pid}: no VmRSS in /proc/{pid}/status")


# --- the two modes -------------------------------------------------------------------------------------------------

def plan_requests(args, texts: list[str]) -> dict[str, tuple[int, list[list[str]]]]:
    """Per scenario: (clients, every request of every round: warm-up then timed, round after round)."""
    plan = {}
    for name, clients, size in SCENARIOS:
        timed = max(args.requests if size == 1 else args.batch_requests, clients)
        per_round = args.warmup * clients + timed
        plan[name] = (clients, make_batches(texts, size, per_round * args.rounds, args.seed))
    return plan


def compare_methods(args, model_dir: Path, archives: dict[str, Path], precision: str, log: Path,
                    before_round=lambda: None, also: tuple[str, ...] = ()) -> dict:
    """Every method, round after round, every scenario: the pooled timings per method and scenario."""
    from transformers import AutoConfig, AutoTokenizer

    config = AutoConfig.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    methods = ([] if args.no_toolkit else [Method(TOOLKIT)]) + [Method("server-fp32", "fp32")]
    methods += [Method(f"server-{name}", name) for name in also if name not in ("fp32", precision)]
    if precision != "fp32":
        methods.append(Method(f"server-{precision}", precision))
    methods.append(Method(AUTO, "auto"))  # last: the server as an endpoint runs it
    plan = plan_requests(args, sample_texts())
    limit = tokenizer.model_max_length if tokenizer.model_max_length < 100_000 else 512
    texts = {text for _, requests in plan.values() for batch in requests for text in batch}  # each tokenized once
    flops = {text: text_flops(len(tokenizer(text, truncation=True, max_length=limit)["input_ids"]), config)
             for text in texts}
    results = {method.name: {name: Timing() for name, *_ in SCENARIOS} for method in methods}
    started = time.perf_counter()
    for round_index in range(args.rounds):
        before_round()
        for method in methods:
            say(f"round {round_index + 1}/{args.rounds}: starting {method.name} ...")
            server = method.start(archives, log, args.workers)
            try:
                for name, (clients, requests) in plan.items():
                    per_round = len(requests) // args.rounds
                    share = requests[round_index * per_round:(round_index + 1) * per_round]
                    warm, timed = share[:args.warmup * clients], share[args.warmup * clients:]
                    if warm:
                        run_load(server.port, [body(batch) for batch in warm], clients)
                    latencies, elapsed = run_load(server.port, [body(batch) for batch in timed], clients)
                    row = results[method.name][name]
                    row.latencies += latencies
                    row.elapsed += elapsed
                    row.texts += sum(len(batch) for batch in timed)
                    row.flops += sum(flops[text] for batch in timed for text in batch)
            finally:
                stop_server(server)
            say(f"round {round_index + 1}/{args.rounds}: {method.name} done ({time.perf_counter() - started:.0f} s)")
    return results


def print_table(results: dict[str, dict[str, Timing]], roof: float) -> None:
    """One line per scenario and method; the last column is requests/s over the first method's (the toolkit's)."""
    reference = next(iter(results))
    header = (f"{'scenario':<10}{'method':<16}{'req/s':>9}{'texts/s':>9}{'p50 ms':>9}{'p99 ms':>9}"
              f"{'GFLOP/s':>9}{'% roof':>8}{'vs ' + reference:>21}")
    say(header)
    say("-" * len(header))
    for name, *_ in SCENARIOS:
        base = results[reference][name].rate
        for method, rows in results.items():
            row = rows[name]
            gflops = row.flops / row.elapsed / 1e9
            say(f"{name:<10}{method:<16}{row.rate:>9.2f}{row.texts / row.elapsed:>9.1f}"
                f"{row.percentile(50) * 1000:>9.1f}{row.percentile(99) * 1000:>9.1f}{gflops:>9.1f}"
                f"{100 * gflops / roof:>7.1f}%{row.rate / base:>20.2f}x")


def rss_check(args, archive: Path, precision: str, log: Path) -> None:
    """Worker RSS over `--rss-requests` single-text requests from RSS_CLIENTS clients, printed every tenth."""
    from inference.sentiment.server.local import LocalServer

    texts = sample_texts()
    rng = random.Random(args.seed)
    step = max(1, args.rss_requests // 10)
    server = LocalServer(archive, args=("--precision", precision, "--workers", str(args.workers)), log=log).start()
    try:
        workers = server_pids(server.process.pid)
        say(f"server RSS over {args.rss_requests} single-text requests from {RSS_CLIENTS} clients, our server at "
            f"{precision}, pid(s) {', '.join(map(str, workers))}")
        say(f"{'requests':>9}{'RSS MiB':>10}{'req/s':>9}")
        samples = [sum(rss_mib(pid) for pid in workers)]
        say(f"{0:>9}{samples[0]:>10.1f}")
        done, started = 0, time.perf_counter()
        while done < args.rss_requests:
            count = min(step, args.rss_requests - done)
            bodies = [body([" ".join(rng.sample(texts, rng.choice((1, 1, 2, 3))))]) for _ in range(count)]
            run_load(server.port, bodies, RSS_CLIENTS)
            done += count
            samples.append(sum(rss_mib(pid) for pid in workers))
            say(f"{done:>9}{samples[-1]:>10.1f}{done / (time.perf_counter() - started):>9.1f}")
    finally:
        stop_server(server)
    first, last = samples[1], samples[-1]
    say(f"RSS at start {samples[0]:.1f} MiB; after the first {step} requests {first:.1f} MiB, after "
        f"{args.rss_requests} {last:.1f} MiB (change {last - first:+.1f} MiB, {100 * (last - first) / first:+.1f}%; "
        f"peak {max(samples):.1f} MiB)")


def first_ping_seconds(archive: Path, log: Path, workers: int) -> float:
    """Seconds from starting our server's process to the first 200 from its /ping (what a container start costs
    on top of pulling the image: Python and torch imports, unpacking the archive, loading and warming the model)."""
    import urllib.error
    import urllib.request

    from inference.sentiment.server.local import LocalServer

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = LocalServer(archive, port=port, args=("--workers", str(workers)), log=log)
    started = time.perf_counter()
    server.launch()
    try:
        while True:
            if processes.poll(server.process) is not None:
                raise RuntimeError(f"the server exited with status {server.process.returncode} before /ping answered: "
                                   + " | ".join(server.lines[-5:]))
            if time.perf_counter() - started > 300:
                raise RuntimeError("no 200 from /ping within 300 s")
            with (contextlib.suppress(OSError, urllib.error.URLError),
                  urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=2) as answer):
                if answer.status == 200:
                    return time.perf_counter() - started
            time.sleep(0.02)
    finally:
        stop_server(server)


def startup_check(args, archive: Path, log: Path) -> None:
    """The archive's size and the time to the first 200 from /ping, over `--starts` starts."""
    with tarfile.open(archive) as tar:
        members = tar.getmembers()
    size = sum(member.size for member in members)
    wheels = [member.name for member in members if member.name.endswith(".whl")]
    say(f"model.tar.gz: {archive.stat().st_size / 2**20:.1f} MiB compressed, {size / 2**20:.1f} MiB in "
        f"{len(members)} files, {len(wheels)} wheels (our image carries the Python dependencies)")
    times = [first_ping_seconds(archive, log, args.workers) for _ in range(args.starts)]
    say(f"start to first 200 from /ping, {args.workers} worker(s): "
        f"{', '.join(f'{value:.1f}' for value in times)} s (median {statistics.median(times):.1f} s)")


def run(args, model_dir: Path, workdir: Path) -> int:
    import transformers
    from transformers import AutoConfig

    from inference.sentiment import accuracy_check
    from inference.sentiment import precision as precisions
    from inference.sentiment.container import worker_threads
    from inference.sentiment.cpu_features import this_cpu
    from training import package

    cpus = len(os.sched_getaffinity(0))
    threads = worker_threads(cpus, args.workers)
    roof_threads = worker_threads(cpus, 1)  # the machine's roof: every thread the workers share
    config = AutoConfig.from_pretrained(model_dir)
    say(f"model: {args.model_dir or f'--preset {args.preset} (random weights)'}: {config.num_hidden_layers} layers "
        f"x {config.hidden_size}; transformers {transformers.__version__}; {cpus} CPUs, {args.workers} worker(s) per "
        f"server with {threads} thread(s) each; load average {os.getloadavg()[0]:.2f}")
    archives = {"server": workdir / "model.tar.gz", "toolkit": workdir / "pipeline.tar.gz"}
    say("packaging model.tar.gz (training.package, which runs the accuracy gate) ...")
    package.build(model_dir, archives["server"], progress=say, serve_on=int8_target.THIS_CPU,  # served here
                  onnx=not args.skip_onnx)
    if args.mode == "compare" and not args.no_toolkit:
        package.build(model_dir, archives["toolkit"], handler=BASELINE_HANDLER, gate=False)

    record = gate_record(archives["server"])
    for line in accuracy_check.report(record):
        say(line)
    figures = {name: precisions.Figures.from_dict(name, data) for name, data in record["figures"].items()}
    precision = record["precision"] if args.precision == "auto" else args.precision
    passed = precision == "fp32" or (precision in figures and figures[precision].passed(
        record["gate"]["min_agreement"], record["gate"]["max_probability_change"]))
    say(f"precision for the gate's row: {precision} "
        f"({'recorded in model.tar.gz' if args.precision == 'auto' else '--precision'}; gate: "
        f"{'passed' if passed else 'FAILED, the server will refuse it'})")
    log = args.log or workdir / "servers.log"
    if args.mode == "rss":
        rss_check(args, archives["server"], precision, log)
        return 0
    if args.mode == "startup":
        startup_check(args, archives["server"], log)
        return 0

    roofs: list[float] = []
    # The roof in the fastest math this CPU has: without bf16 instructions a bf16 matmul runs torch's reference
    # kernel (about 60x slower than fp32 on a Zen 2), which would take many minutes and mean nothing.
    roof_dtype = "bf16" if this_cpu().available else "fp32"
    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    # A row for every pair the gate passed, so the auto row is compared with each (bf16 only where this CPU has the
    # instructions: emulated, it would take minutes per scenario and mean nothing).
    also = tuple(name for name, entry in figures.items() if entry.passed(
        record["gate"]["min_agreement"], record["gate"]["max_probability_change"])
        and (name != "bf16" or this_cpu().available) and (args.pairs is None or name in args.pairs))
    results = compare_methods(args, model_dir, archives, precision, log,
                              before_round=lambda: roofs.append(gemm_roof(roof_threads, roof_dtype)), also=also)
    roof = max(roofs)
    say(f"\n{roof_dtype} GEMM roof (2048x2048 matmul, {roof_threads} thread(s), before each round, no server "
        f"running): {', '.join(f'{value:.0f}' for value in roofs)} GFLOP/s; the table uses the highest, {roof:.0f}")
    print_table(results, roof)
    say(f"\ncN: N concurrent clients, one text per request; bN: one client, N texts per request. GFLOP/s: useful "
        f"forward-pass work (no padding) per second; % roof: of the {roof_dtype} GEMM roof. {args.rounds} round(s), "
        f"methods taking turns, {time.perf_counter() - started:.0f} s; load average before {load_before:.2f}, after "
        f"{os.getloadavg()[0]:.2f} (other work on a shared machine skews every row).")
    if TOOLKIT in results:
        best = list(results)[-1]
        ratio = results[best][GOAL_SCENARIO].rate / results[TOOLKIT][GOAL_SCENARIO].rate
        met = ratio >= GOAL_RATIO and passed
        say(f"goal: {best} at {GOAL_SCENARIO} = {ratio:.2f}x {TOOLKIT}'s requests/s (goal >= {GOAL_RATIO:g}x with "
            f"the gate passed; gate: {'passed' if passed else 'failed'}): {'MET' if met else 'NOT MET'}")
    others = {name: timing[GOAL_SCENARIO].rate for name, timing in results.items() if name not in (AUTO, TOOLKIT)}
    if AUTO in results and others:
        fastest = max(others, key=others.get)
        ratio = results[AUTO][GOAL_SCENARIO].rate / others[fastest]
        say(f"goal (issue 44): {AUTO} (its own choice, in the servers' log) at {GOAL_SCENARIO} = {ratio:.2f}x the "
            f"fastest other row, {fastest} (goal >= {1 - AUTO_TOLERANCE:.2f}x): "
            f"{'MET' if ratio >= 1 - AUTO_TOLERANCE else 'NOT MET'}")
    best = f"server-{precision}" if f"server-{precision}" in results else "server-fp32"
    if "server-bf16" in results and best != "server-bf16":
        ratio = results[best][GOAL_SCENARIO].rate / results["server-bf16"][GOAL_SCENARIO].rate
        met = ratio >= BEST_OVER_BF16_RATIO and passed
        say(f"goal (issue 35): {best} at {GOAL_SCENARIO} = {ratio:.2f}x server-bf16's requests/s (goal >= "
            f"{BEST_OVER_BF16_RATIO:g}x with the gate passed): {'MET' if met else 'NOT MET'}")
    return 0


# --- CLI -----------------------------------------------------------------------------------------------------------

def pair_list(value: str) -> tuple[str, ...]:
    names = tuple(name.strip() for name in value.split(",") if name.strip())
    wrong = [name for name in names if name not in PRECISIONS]
    if wrong:
        raise argparse.ArgumentTypeError(f"{', '.join(wrong)}: not a pair; allowed: {', '.join(PRECISIONS)}")
    return names


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                     epilog="Exit status: 0 done or stopped by SIGTERM, 1 a server failed, "
                                            "2 bad arguments or model, 130 Ctrl-C.",
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--mode", choices=("compare", "rss", "startup"), default="compare",
                        help="compare: the table of every row and scenario; rss: worker RSS over --rss-requests; "
                             "startup: the archive's size and the time from start to the first 200 from /ping")
    parser.add_argument("--model-dir", type=Path, default=None,
                        help="a saved model (default: build a random-weight one, see --preset)")
    parser.add_argument("--preset", choices=("base", "tiny"), default="base",
                        help="random-weight model to build without --model-dir: RoBERTa-base size, or 2 x 64")
    parser.add_argument("--precision", choices=("auto", *PRECISIONS), default="auto",
                        help="the gate row's precision; auto: the one the gate recorded in the archive (the server "
                             "refuses one that failed the gate)")
    parser.add_argument("--requests", type=positive_int, default=64,
                        help="timed single-text requests per scenario, method and round (at least one per client)")
    parser.add_argument("--batch-requests", type=positive_int, default=6,
                        help="timed requests per method and round for the 8- and 32-text scenarios")
    parser.add_argument("--warmup", type=non_negative_int, default=1,
                        help="untimed requests per client before each scenario")
    parser.add_argument("--rounds", type=positive_int, default=2, help="times the methods take turns")
    parser.add_argument("--rss-requests", type=positive_int, default=10_000, help="requests of --mode rss")
    parser.add_argument("--workers", type=positive_int, default=1,
                        help="workers of every server: TorchServe worker processes for the toolkit row, model replicas "
                        "(inference threads) for ours; threads each: the endpoint's formula")
    parser.add_argument("--starts", type=positive_int, default=3, help="server starts timed by --mode startup")
    parser.add_argument("--no-toolkit", action="store_true", help="leave out the toolkit row (no TorchServe)")
    parser.add_argument("--skip-onnx", action="store_true",
                        help="package without the ONNX export: torch's pairs only (the export takes about 17 s for "
                             "RoBERTa-base on 2 vCPUs)")
    parser.add_argument("--pairs", type=pair_list, default=None, metavar="PAIR,...",
                        help="the forced pairs that get a row beside fp32, the gate's pick and server-auto (default: "
                             "every pair the gate passed)")
    parser.add_argument("--seed", type=int, default=0, help="seed for choosing the texts")
    parser.add_argument("--log", type=Path, default=None,
                        help="append the servers' output here (default: a temporary file, removed)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    previous = install_stop_handlers()
    try:
        return _main(args)
    except Interrupted as stop:
        print(f"{PROG}: stopped by {stop}; servers stopped, no figures", file=sys.stderr, flush=True)
        return STOP_STATUS[stop.signum]
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)  # in-process callers (tests) get their own handling back


def _main(args) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    from inference.sentiment.accuracy_check import build_random_model
    from inference.sentiment.local_stack import StackError
    from inference.sentiment.server.local import ServerError
    from training.package import PackageError

    with tempfile.TemporaryDirectory(prefix="bench-server-") as directory:
        workdir = Path(directory)
        try:
            if args.model_dir:
                model_dir = args.model_dir
                if not (model_dir / "config.json").is_file():
                    raise PackageError(f"--model-dir {model_dir}: no config.json, not a saved model")
            else:
                say(f"building a random-weight {args.preset} model ...")
                model_dir = (build_random_model(workdir / "model", "roberta-base") if args.preset == "base"
                             else build_model_dir(workdir / "model", args.preset))
            return run(args, model_dir, workdir)
        except PackageError as error:
            print(f"{PROG}: error: {error}", file=sys.stderr)
            return 2
        except (StackError, ServerError, RuntimeError, OSError) as error:
            print(f"{PROG}: error: {error}", file=sys.stderr)
            return 1


if __name__ == "__main__":
    sys.exit(main())
