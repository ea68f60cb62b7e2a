"""The trained model behind HTTP: ``serve(cfg)`` behind ``serve.py``.

``workers_per_device`` processes per device (each GPU; on a CPU, each core by default), each with its
copy of the model and its own event loop (uvicorn, Starlette: ``http_api``), all accepting on one
listening socket, as uvicorn's ``--workers`` does; this process places them and starts one again
should it end.

Written on uvicorn and Starlette rather than LitServe (Lightning's serving library), by measurement
(benchmarks/serving.py, 2 CPU cores, one image a request, wrk as the client): LitServe 0.2.19 answered
820 requests a second at 32 clients (1,090 with one torch thread), its one inference process at 100%
of a core on queue traffic through a multiprocessing manager, twice per request; a process that reads
requests and runs the model itself answers 8,200, as fast as the same code without HTTP.
"""

import functools
import logging
import multiprocessing
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from multiprocessing.connection import wait
from typing import Any, NamedTuple

from omegaconf import DictConfig, OmegaConf

from mnistlab.runtime.config import hydra_versions
from mnistlab.runtime.run.failures import InputError

log = logging.getLogger(__name__)
STEADY_S = 60  # a process that ends sooner after its start is not started again: the server stops


class Placed(NamedTuple):
    device: str
    started: float  # time.monotonic()


def serve(cfg: DictConfig) -> None:
    from mnistlab.trained import inference

    decode = hydra_versions.plain_partial(cfg.decode)  # a bad decode config fails here, in one line
    probe = inference.load(cfg.ckpt_path, "cpu", cfg.paths.data_dir, cfg.trusted_modules)  # so does a bad model file
    if shape := getattr(sys.modules[decode.func.__module__], "SHAPE", None):  # a decoder of one shape says which
        probe.expect(shape, f"decode ({cfg.decode._target_})")  # refused now, not with a 400 on every request
    devices = placement(cfg.accelerator, cfg.devices, cfg.workers_per_device)
    threads = max(1, len(os.sched_getaffinity(0)) // len(devices))  # torch's, per process: no oversubscription
    info = {
        "model": {"task": probe.card["task"], "classes": probe.classes, "model": str(cfg.ckpt_path)},
        "server": {
            "devices": devices,
            "torch_threads": threads,
            **{k: cfg[k] for k in ("max_batch_size", "batch_timeout")},
        },
    }
    held = _listen(cfg.host, cfg.port)  # the port, held: another program's gets a clear error
    signal.signal(signal.SIGTERM, lambda *_: _stop())  # the processes' finally below ends them too
    settings = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(settings, dict)  # a DictConfig's container
    start = functools.partial(_start, settings=settings, threads=threads, info=info)
    processes = dict(start(device) for device in devices)
    log.info("Serving %s on http://%s:%d/predict (%d processes: %s; health: /health)",
             cfg.ckpt_path, cfg.host, cfg.port, len(devices), ", ".join(devices))  # fmt: skip
    try:
        _supervise(processes, start)
    finally:
        for process in processes:
            process.terminate()  # SIGTERM: uvicorn finishes the requests it holds
        for process in processes:
            process.join(timeout=30)
        held.close()


def placement(accelerator: str, devices: str | int, per_device: int) -> list[str]:
    """The device of each server process: ``per_device`` processes on each GPU, or on each CPU "device"
    (a core, ``devices=auto``)."""
    import torch

    gpus = torch.cuda.device_count()
    if accelerator == "cuda" and not gpus:
        raise InputError("accelerator=cuda needs a CUDA GPU and this machine has none; use accelerator=cpu")
    if accelerator == "cpu" or not gpus:
        count = len(os.sched_getaffinity(0)) if devices == "auto" else int(devices)
        return ["cpu"] * count * per_device
    count = gpus if devices == "auto" else int(devices)
    if count > gpus:
        raise InputError(f"devices={count}, but this machine has {gpus} CUDA GPU(s)")
    return [f"cuda:{i}" for i in range(count) for _ in range(per_device)]


def _listen(host: str, port: int, backlog: int | None = None) -> socket.socket:
    """A socket on ``host:port`` that the server's processes share by SO_REUSEPORT: the kernel deals
    the connections out evenly. One socket accepted from by all (uvicorn's ``--workers``) let the first
    process to wake take most of the connections a client opens at once (measured: 32 of wrk's
    connections served by one of two processes, at half the throughput). Without ``backlog`` (this
    process's), the port is first checked free, then held without taking connections."""
    if backlog is None:
        with socket.socket(_family(host)) as probe:  # SO_REUSEPORT would share a port another server holds
            _bind(probe, host, port)
    listening = socket.socket(_family(host))
    listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    _bind(listening, host, port)
    if backlog is not None:
        listening.listen(backlog)
    return listening


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _bind(listening: socket.socket, host: str, port: int) -> None:
    try:
        listening.bind((host, port))
    except OSError as err:
        listening.close()
        raise InputError(f"cannot listen on {host}:{port} ({err.strerror}): choose another port=") from None


def _stop() -> None:
    raise SystemExit(0)


def _start(device: str, settings: dict, threads: int, info: dict) -> tuple[Any, Placed]:
    process = multiprocessing.get_context("spawn").Process(
        target=_process, args=(settings, device, threads, info), name=f"server-{device}", daemon=True
    )
    process.start()
    return process, Placed(device, time.monotonic())


def _supervise(processes: dict[Any, Placed], start: Callable[[str], tuple[Any, Placed]]) -> None:
    """Wait on the processes; start again one that ends after running steadily, stop at one that did not."""
    while True:
        for ended in wait([process.sentinel for process in processes]):
            process = next(p for p in processes if p.sentinel == ended)
            placed = processes.pop(process)
            if time.monotonic() - placed.started < STEADY_S:
                raise InputError(
                    f"the server process on {placed.device} ended (exit code {process.exitcode}): see above"
                )
            log.warning(
                "The server process on %s ended (exit code %s): starting it again", placed.device, process.exitcode
            )
            processes.update([start(placed.device)])


def _process(settings: dict, device: str, threads: int, info: dict) -> None:
    """One server process: the model on ``device``, then uvicorn on its socket of the port until SIGTERM."""
    import torch
    import uvicorn

    from mnistlab.trained import inference
    from mnistlab.trained.serving import http_api

    torch.set_num_threads(threads)
    logging.getLogger("mnistlab").setLevel(logging.ERROR)  # what loading the model warns, this process's parent said
    cfg = OmegaConf.create(settings)
    net = inference.load(cfg.ckpt_path, device, cfg.paths.data_dir, cfg.trusted_modules)
    decode = hydra_versions.plain_partial(cfg.decode)
    api = http_api.app(net, decode, cfg, info)
    config = uvicorn.Config(api, access_log=False, log_level="warning", timeout_graceful_shutdown=cfg.timeout)
    uvicorn.Server(config).run(sockets=[_listen(cfg.host, cfg.port, backlog=2048)])
