"""run_info.json: every run records its code, versions, machine and data, and each checkpoint the essentials;
an entry point that reads a checkpoint written by other code or data says so in one line."""

import hashlib
import json
import logging
import platform
from pathlib import Path

import pytest
import torch
from hydra.utils import instantiate

from mnistlab.runtime.checkpointing.checkpoint_io import load_checkpoint
from mnistlab.runtime.reporting import provenance, run_record
from mnistlab.runtime.run import run_folder

from composing import SHORT, compose_config


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / provenance.PACKAGE / "checksums.json"


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from mnistlab.tasks import train  # not at import: see tests/faults.py

    out = tmp_path_factory.mktemp("recorded")
    train(compose_config("train", out, [*SHORT, "logger=none", "seed=7"]))
    return out


def test_a_run_records_its_code_versions_machine_and_data(run: Path) -> None:
    record = json.loads((run / "run_info.json").read_text())
    assert record["commit"] == provenance.commit() and record["status"] == "finished"
    assert record["start"] <= record["end"] and record["seed"] == 7
    assert (
        record["versions"]["torch"] == torch.__version__ and record["versions"]["python"] == platform.python_version()
    )
    machine = record["machine"]
    assert (machine["nodes"], machine["devices_per_node"], machine["accelerator"]) == (1, 1, "cpu")
    assert machine["gpus"] == [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    files = run_record.data_files(instantiate(compose_config("train", run).data))  # what the data module reads
    assert record["data"] == {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in files}
    if record["diff_sha256"]:  # a dirty tree: the diff beside the record, under its hash
        diff = (run / "run_info.diff").read_text()
        assert hashlib.sha256(diff.encode()).hexdigest() == record["diff_sha256"]
    served = instantiate(compose_config("train", run).data)
    served.prepare_data()
    served.setup("fit")
    first = next(iter(served.train_dataloader()))[0]  # one input of the network, as the data module serves it
    for checkpoint in run_folder.checkpoints(run).glob("*.ckpt"):
        saved = load_checkpoint(checkpoint)
        assert saved["run_info"] == {key: record[key] for key in run_record.ESSENTIALS}
        assert saved["input"] == {"shape": list(first.shape[1:]), "dtype": str(first.dtype).removeprefix("torch.")}


def test_checksums_are_computed_once_per_file_while_it_stays_the_same(tmp_path: Path, cache: Path) -> None:
    data = tmp_path / "data.bin"
    data.write_bytes(b"x" * 3000)
    assert run_record.checksums([data]) == {"data.bin": hashlib.sha256(b"x" * 3000).hexdigest()}
    entries = json.loads(cache.read_text())
    (entry,) = entries.values()
    entry["sha256"] = "kept"  # read from the cache, not the file, while size and time are the same
    cache.write_text(json.dumps(entries))
    assert run_record.checksums([data]) == {"data.bin": "kept"}
    data.write_bytes(b"y" * 3001)  # changed: computed again
    assert run_record.checksums([data]) == {"data.bin": hashlib.sha256(b"y" * 3001).hexdigest()}


def test_a_checkpoint_of_other_code_or_data_is_named_in_one_warning(
    run: Path, tmp_path: Path, cache: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from mnistlab.tasks import evaluate

    checkpoint = load_checkpoint(run_folder.last_checkpoint(run))
    checkpoint["run_info"] |= {"commit": "0123abc", "versions": {"torch": "1.0"}}
    changed = sorted(checkpoint["run_info"]["data"])[:1]  # a data file, where the data module reads any
    checkpoint["run_info"]["data"] |= dict.fromkeys(changed, "0" * 64)
    other = tmp_path / "other.ckpt"
    torch.save(checkpoint, other)
    with caplog.at_level(logging.WARNING):
        evaluate(compose_config("eval", tmp_path, [f"ckpt_path={other}", "trainer.limit_test_batches=2"]))
    (line,) = [r.getMessage() for r in caplog.records if "written by other code or data" in r.getMessage()]
    assert "code 0123abc" in line and "torch 1.0" in line
    assert all(f"data file {name} differs" in line for name in changed)
    assert line.count("data file") == len(changed)  # the files that did not change are not named
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        evaluate(
            compose_config(
                "eval", tmp_path, [f"ckpt_path={run / 'checkpoints' / 'last.ckpt'}", "trainer.limit_test_batches=2"]
            )
        )
    assert not [r for r in caplog.records if "written by other code or data" in r.getMessage()]
