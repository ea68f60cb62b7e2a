"""What the HTTP server costs: ``python benchmarks/serving.py [--model <.ckpt or .onnx>] [--clients 1 8 32]
[--requests 512] [--repeats 3]``.

The same MNIST test digits, as PNG files, classified two ways in one run: by ``serve.py`` (one image per
``POST /predict``, sent by 1, 8 and 32 concurrent clients on keep-alive connections) and in this process
by the same code without HTTP (``digits.decode`` then ``Classifier.probabilities`` on batches of the
server's ``max_batch_size``: the most an in-process caller gets). For each number of clients: requests
a second, and the median (p50) and 99th-percentile (p99) latency of a request; then the server's
throughput at the most clients as a fraction of in-process. Target: at least 0.6 at 32 clients. Each
figure is the median of ``--repeats`` rounds after a warm-up round. The clients run in this process, on
the server's machine: their CPU time counts against the server's (on 2 cores, a real cost). Without
``--model`` a checkpoint is trained first (one epoch, ``DATA_DIR``'s MNIST). Prints a table and writes
it as JSON to outputs/benchmarks/.
"""

import argparse
import asyncio
import base64
import io
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
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
    from mnistlab.trained import classifier, digits

    net = classifier.load(model, "cpu", os.environ.get("DATA_DIR", str(ROOT / "data")))

    def once() -> float:
        start = time.perf_counter()
        for first in range(0, len(bodies), BATCH):
            inputs = np.stack([digits.decode(b, max_pixels=50_000_000) for b in bodies[first : first + BATCH]])
            net.probabilities(inputs)
        return len(bodies) / (time.perf_counter() - start)

    once()  # warm-up
    return statistics.median(once() for _ in range(repeats))


async def _load(url: str, bodies: list[bytes], clients: int, per_body: int) -> tuple[float, list[float]]:
    """``clients`` concurrent clients send every body (``per_body`` images each) once between them: images
    a second, latencies.

    aiohttp, not httpx: against an endpoint that only answers, httpx's async client made 480 requests a
    second at 32 clients here, aiohttp 11,000 (the server would have measured the client)."""
    queue = list(reversed(bodies))
    latencies: list[float] = []
    kind = {"Content-Type": "application/json" if per_body > 1 else "image/png"}

    async def client(http: aiohttp.ClientSession) -> None:
        while queue:
            body = queue.pop()
            sent = time.perf_counter()
            async with http.post(f"{url}/predict", data=body, headers=kind) as answer:
                if answer.status != 200:
                    raise SystemExit(f"the server answered {answer.status}: {await answer.text()}")
                await answer.read()
            latencies.append(time.perf_counter() - sent)

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=clients)) as http:
        start = time.perf_counter()
        await asyncio.gather(*(client(http) for _ in range(clients)))
    return len(bodies) * per_body / (time.perf_counter() - start), latencies


def over_http(url: str, bodies: list[bytes], clients: int, repeats: int, per_body: int = 1) -> dict[str, float]:
    """Images a second and p50/p99 latency (ms) of a request at ``clients`` clients, each request an image
    (or, ``per_body`` > 1, a JSON batch of as many): the medians over ``repeats``."""
    asyncio.run(_load(url, bodies, clients, per_body))  # warm-up: connections opened, the worker's caches filled
    rounds = [asyncio.run(_load(url, bodies, clients, per_body)) for _ in range(repeats)]
    return {
        "images/s": round(statistics.median(r for r, _ in rounds), 1),
        "p50 ms": round(statistics.median(1e3 * float(np.percentile(lat, 50)) for _, lat in rounds), 2),
        "p99 ms": round(statistics.median(1e3 * float(np.percentile(lat, 99)) for _, lat in rounds), 2),
    }


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


def measure(
    model: Path, bodies: list[bytes], clients: list[int], repeats: int, out: Path, overrides: list[str]
) -> dict[str, float]:
    rows: dict[str, float] = {"in-process images/s": round(in_process(model, bodies, repeats), 1)}
    server, url = start_server(model, out, overrides)
    try:
        for count in clients:
            rows |= {f"server, {count} clients, {k}": v for k, v in over_http(url, bodies, count, repeats).items()}
        batches = [_json_batch(bodies[i : i + BATCH]) for i in range(0, len(bodies) - BATCH + 1, BATCH)]
        for count in (1, min(8, max(clients))):
            rows |= {
                f"server, {count} clients of JSON batches of {BATCH}, {k}": v
                for k, v in over_http(url, batches, count, repeats, per_body=BATCH).items()
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
    parser.add_argument("--requests", type=int, default=512, help=f"images classified in each round (>= {BATCH})")
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds of each row; the median is reported")
    parser.add_argument("--out", type=Path, default=ROOT / "outputs" / "benchmarks", help="where the JSON goes")
    parser.add_argument("overrides", nargs="*", help="overrides of serve.py (conf/serve.yaml): workers_per_device=2")
    args = parser.parse_args()
    if args.model is not None and not args.model.is_file():
        raise SystemExit(f"--model {args.model}: no such file")
    bodies = test_images(args.requests)
    with tempfile.TemporaryDirectory() as work:
        model = args.model.resolve() if args.model else trained(Path(work) / "run")
        rows = measure(model, bodies, args.clients, args.repeats, Path(work), args.overrides)
    publish(rows, args.out, "serving")


if __name__ == "__main__":
    main()
