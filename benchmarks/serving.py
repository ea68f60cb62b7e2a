# Part of the MNIST example: a project generated without it has no such file.
"""What the HTTP server costs: ``python benchmarks/serving.py [--model <.ckpt or .onnx>] [--clients 1 8 32]
[--requests 512] [--repeats 3] [--seconds 5] [serve.py overrides]``.

The same MNIST test digits, as PNG files, classified two ways in one run: by ``serve.py`` (one image per
``POST /predict``, sent by 1, 8 and 32 concurrent clients on keep-alive connections; then JSON batches of
32) and in this process by the same code without HTTP (``digits.decode`` then ``TrainedModel.probabilities``
on batches of the server's ``max_batch_size``: the most an in-process caller gets). For each number of
clients: images a second, and the median (p50) and 99th-percentile (p99) latency of a request; then the
server's throughput at the most clients as a fraction of in-process. Target: at least 0.6 at 32 clients.
Each figure is the median of ``--repeats`` rounds of ``--seconds`` after a warm-up round.

The clients are wrk's (an HTTP load generator written in C; ``apt-get install wrk``), on the server's
machine: a Python client (aiohttp) took a core of this 2-core machine to send 8,000 requests a second,
and measured itself. Without ``--model`` a checkpoint is trained first (one epoch, ``DATA_DIR``'s MNIST).
Prints a table and writes it as JSON to outputs/benchmarks/.
"""

import argparse
import base64
import io
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
from PIL import Image
from timing import ROOT, publish, wall

BATCH = 32  # the server's max_batch_size (conf/serve.yaml) and the in-process batch


def test_images(count: int) -> list[bytes]:
    """The first ``count`` MNIST test digits as PNG files, as a client would send them."""
    from torchvision.datasets import MNIST

    images = MNIST(os.environ.get("DATA_DIR", str(ROOT / "data")), train=False).data[:count].numpy()
    bodies = []
    for image in images:
        file = io.BytesIO()
        Image.fromarray(image).save(file, format="PNG")
        bodies.append(file.getvalue())
    return bodies


def in_process(model: Path, bodies: list[bytes], repeats: int) -> float:
    """Images a second classified here, without HTTP: decoded and prepared, then in batches of BATCH."""
    from mnistlab.example import digits
    from mnistlab.trained import inference

    net = inference.load(model, "cpu", os.environ.get("DATA_DIR", str(ROOT / "data")))

    def once() -> float:
        start = time.perf_counter()
        for first in range(0, len(bodies), BATCH):
            inputs = np.stack([digits.decode(b, max_pixels=50_000_000) for b in bodies[first : first + BATCH]])
            net.probabilities(inputs)
        return len(bodies) / (time.perf_counter() - start)

    once()  # warm-up
    return statistics.median(once() for _ in range(repeats))


def over_http(url: str, bodies: list[bytes], clients: int, args: argparse.Namespace, per_body: int = 1) -> dict:
    """Images a second and p50/p99 latency (ms) of a request at ``clients`` clients, each request an image
    (or, ``per_body`` > 1, a JSON batch of as many): the medians over ``args.repeats`` rounds."""
    kind = "application/json" if per_body > 1 else "image/png"
    with tempfile.TemporaryDirectory() as folder:
        for n, body in enumerate(bodies):
            (Path(folder) / f"{n:05d}.body").write_bytes(body)

        def wrk(seconds: int) -> list[str]:
            return [
                "wrk", f"--threads={min(clients, os.cpu_count() or 1)}", f"--connections={clients}",
                f"--duration={seconds}s", f"--script={ROOT / 'benchmarks' / 'wrk_post.lua'}", url,
                "--", folder, str(len(bodies)), kind,
            ]  # fmt: skip

        _wrk(wrk(1))  # warm-up: connections opened, caches filled
        rounds = [_wrk(wrk(args.seconds)) for _ in range(args.repeats)]
    return {
        "images/s": round(statistics.median(r["requests"] * per_body / r["seconds"] for r in rounds), 1),
        "p50 ms": round(statistics.median(r["p50_us"] / 1e3 for r in rounds), 2),
        "p99 ms": round(statistics.median(r["p99_us"] / 1e3 for r in rounds), 2),
    }


def _wrk(command: list[str]) -> dict:
    """One round of wrk: what wrk_post.lua printed; every request must have been answered 200."""
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise SystemExit(f"wrk exited {result.returncode}: {result.stderr[-2000:]}")
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    if figures["failed"] or not figures["requests"]:
        raise SystemExit(f"{figures['failed']} of {figures['requests']} requests failed:\n{result.stdout[-2000:]}")
    return figures


def _json_batch(bodies: list[bytes]) -> bytes:
    return json.dumps({"images": [base64.b64encode(body).decode() for body in bodies]}).encode()


def start_server(model: Path, out: Path, overrides: list[str]) -> tuple[subprocess.Popen, str]:
    """serve.py on a free local port, as a user starts it; its address once /health answers."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [
        sys.executable, "serve.py", f"ckpt_path={model}", f"port={port}", f"max_batch_size={BATCH}",
        f"hydra.run.dir={out / 'serve'}", *overrides,
    ]  # fmt: skip
    log = open(out / "serve.log", "w")  # noqa: SIM115 -- the server writes it until it is ended
    server = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    for _ in range(240):
        if server.poll() is not None:
            raise SystemExit(f"serve.py ended ({server.returncode}):\n{(out / 'serve.log').read_text()[-3000:]}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return server, url
        except httpx.TransportError:  # not listening yet
            pass
        time.sleep(0.5)
    os.killpg(server.pid, signal.SIGKILL)
    raise SystemExit(f"serve.py was not ready in 120 s:\n{(out / 'serve.log').read_text()[-3000:]}")


def trained(out: Path) -> Path:
    """A checkpoint of one epoch, for a run without --model."""
    wall([sys.executable, "train.py", "trainer.max_epochs=1", "logger=none", "test=false", f"hydra.run.dir={out}"])
    return out / "checkpoints" / "last.ckpt"


def measure(model: Path, bodies: list[bytes], args: argparse.Namespace, out: Path) -> dict[str, float]:
    rows: dict[str, float] = {"in-process images/s": round(in_process(model, bodies, args.repeats), 1)}
    server, url = start_server(model, out, args.overrides)
    clients = args.clients
    try:
        for count in clients:
            rows |= {f"server, {count} clients, {k}": v for k, v in over_http(url, bodies, count, args).items()}
        batches = [_json_batch(bodies[i : i + BATCH]) for i in range(0, len(bodies) - BATCH + 1, BATCH)]
        for count in (1, min(8, max(clients))):
            rows |= {
                f"server, {count} clients of JSON batches of {BATCH}, {k}": v
                for k, v in over_http(url, batches, count, args, per_body=BATCH).items()
            }
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)
    most = max(clients)
    rows[f"server at {most} clients / in-process (target >= 0.6)"] = round(
        rows[f"server, {most} clients, images/s"] / rows["in-process images/s"], 3
    )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=Path, help="a checkpoint of train.py or an exported .onnx (default: train one)")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32], help="concurrent clients, each a row")
    parser.add_argument(
        "--requests", type=int, default=512, help=f"test images, sent in turn for as long as a round lasts (>= {BATCH})"
    )
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds of each row; the median is reported")
    parser.add_argument("--seconds", type=int, default=5, help="how long each round sends requests")
    parser.add_argument("--out", type=Path, default=ROOT / "outputs" / "benchmarks", help="where the JSON goes")
    parser.add_argument("overrides", nargs="*", help="overrides of serve.py (conf/serve.yaml): workers_per_device=2")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit(
            "the clients are wrk's (an HTTP load generator in C): apt-get install wrk, or brew install wrk"
        )
    if args.model is not None and not args.model.is_file():
        raise SystemExit(f"--model {args.model}: no such file")
    bodies = test_images(args.requests)
    with tempfile.TemporaryDirectory() as work:
        model = args.model.resolve() if args.model else trained(Path(work) / "run")
        rows = measure(model, bodies, args, Path(work))
    publish(rows, args.out, "serving")


if __name__ == "__main__":
    main()
