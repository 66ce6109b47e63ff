"""The calibration cache when it goes wrong: a corrupt, truncated or binary file, two jobs
calibrating into one directory at once, a cache from another ringlet version or another layout.
Each is a whole job (2 ranks under mpirun, with a cache directory of its own), bounded in time:
it must end, exit 0, warn at most once, and leave a valid cache. Run with plain pytest."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))

# Calibration at a few small sizes (as tests/collectives/test_selector.py's quick_calibration):
# a second or two, not the full budget.
QUICK = """
    import os, sys, warnings
    warnings.simplefilter("always")  # count every warning, not the first per place
    import numpy as np
    import ringlet
    from ringlet import calibration
    calibration.CALIBRATION_SIZES = (8, 4096, 65536)
    calibration.LARGE_CALIBRATION_SIZE = 262144
"""
# The first auto call calibrates (or reads the cache), on every rank; the result is exact.
AUTO_CALL = """
    x = ringlet.allreduce(np.arange(1000, dtype=np.float32))
    assert np.array_equal(x, 2 * np.arange(1000, dtype=np.float32)), x
    found = calibration.installed()
    print(f"rank {ringlet.rank()} source: {found.source}", flush=True)
    if ringlet.rank() == 0:
        print(f"cache path: {calibration.cache_path(calibration.calibration_key())}", flush=True)
"""
WARNING = "unreadable calibration cache"


def start(script: str, cache: Path, ranks: int = 2) -> tuple[subprocess.Popen, Path]:
    path = ROOT / "build" / f"cache_job_{os.getpid()}_{time.monotonic_ns()}.py"
    path.parent.mkdir(exist_ok=True)
    path.write_text(textwrap.dedent(script))
    process = subprocess.Popen(
        ["mpirun", "-n", str(ranks), sys.executable, str(path)], cwd=ROOT,
        env={**os.environ, "RINGLET_CACHE_DIR": str(cache)},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    return process, path


def finish(process: subprocess.Popen, script: Path, timeout: float = 90) -> str:
    """The job's output; fails the test if it does not end in time (never a hang) or fails."""
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        pytest.fail(f"the job still ran after {timeout} s:\n{output}")
    finally:
        script.unlink(missing_ok=True)
    assert process.returncode == 0, output
    return output


def run(script: str, cache: Path) -> str:
    return finish(*start(script, cache))


def cache_file(output: str) -> Path:
    # Searched, not read by line: the ranks' output can interleave within a line.
    found = re.search(r"cache path: (\S+?\.json)", output)
    assert found, output
    return Path(found[1])


def assert_valid_cache(directory: Path) -> dict:
    """The one cache file in ``directory``, parsed as ringlet parses it; no temporary left."""
    files = sorted(p.name for p in directory.iterdir())
    assert len(files) == 1 and files[0].startswith("calibration-") \
        and files[0].endswith(".json"), files
    from ringlet.calibration import CACHE_FORMAT

    data = json.loads((directory / files[0]).read_text())
    assert data["format"] == CACHE_FORMAT and data["parameters"]["alpha"] > 0
    return data


@pytest.fixture
def calibrated(tmp_path) -> tuple[Path, str]:
    """A cache directory holding one good calibration, and its file's text."""
    output = run(QUICK + AUTO_CALL, tmp_path)
    assert output.count("source: calibrated now") == 2, output
    return cache_file(output), cache_file(output).read_text()


@pytest.mark.parametrize("damage", ["truncated", "binary", "empty", "wrong types", "invalid"])
def test_a_damaged_cache_is_recalibrated_with_exactly_one_warning(calibrated, damage):
    path, text = calibrated
    path.write_bytes({
        "truncated": text[: len(text) // 2].encode(),  # as a full disk or a killed writer leaves it
        "binary": bytes(range(256)) * 8,  # not even UTF-8
        "empty": b"",
        "wrong types": json.dumps({**json.loads(text), "calibration_seconds": None}).encode(),
        "invalid": json.dumps({**json.loads(text), "parameters": {"alpha": -1}}).encode(),
    }[damage])
    # init and the first auto call both look for the cache; explain() reads it too.
    output = run(QUICK + """
    ringlet.init()
    """ + AUTO_CALL + """
    ringlet.explain(1000)
    """, path.parent)
    assert output.count(WARNING) == 1, output
    assert output.count("source: calibrated now") == 2, output
    assert_valid_cache(path.parent)
    again = run(QUICK + AUTO_CALL, path.parent)
    assert output.count(WARNING) == 1 and again.count(f"source: {path}") == 2, again


def test_two_jobs_calibrating_at_once_leave_one_valid_file(tmp_path):
    """Both jobs calibrate (neither finds a cache) and save into one directory at about the
    same time: both succeed, and the directory holds one whole file, no temporaries."""
    jobs = [start(QUICK + AUTO_CALL, tmp_path) for _ in range(2)]
    outputs = [finish(*job, timeout=120) for job in jobs]
    for output in outputs:
        assert WARNING not in output and "cannot save" not in output, output
        assert output.count("source: ") == 2, output
    saved = assert_valid_cache(tmp_path)
    # The file is one of the two jobs' calibrations, whole: a third job reads it.
    third = run(QUICK + AUTO_CALL, tmp_path)
    assert third.count(f"source: {cache_file(third)}") == 2, third
    assert json.loads(cache_file(third).read_text()) == saved


def test_saving_is_atomic_for_a_reader_and_concurrent_writers(tmp_path):
    """Two processes save alternately two different texts into one file, as fast as they can,
    while this one reads it: every read is one whole text, and no temporary file is left."""
    path = tmp_path / "calibration-test.json"
    texts = [json.dumps({"writer": w, "padding": "x" * (300_000 + 1000 * w)}) for w in (0, 1)]
    writer = textwrap.dedent("""
        import sys, time
        from pathlib import Path
        sys.path.insert(0, sys.argv[1])
        from ringlet.calibration import save
        text = open(sys.argv[3]).read()
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            save(Path(sys.argv[2]), text)
    """)
    sources = []
    for w, text in enumerate(texts):
        source = tmp_path / f"text{w}"
        source.write_text(text)
        sources.append(source)
    path.write_text(texts[0])
    writers = [subprocess.Popen([sys.executable, "-c", writer, str(ROOT / "python"), str(path),
                                 str(s)]) for s in sources]
    reads = set()
    try:
        while any(w.poll() is None for w in writers):
            text = path.read_text()
            assert text in texts, f"a read saw part of a file ({len(text)} characters)"
            reads.add(texts.index(text))
    finally:
        for w in writers:
            w.wait(timeout=30)
    assert all(w.returncode == 0 for w in writers)
    assert reads == {0, 1}, "the reader saw both writers' files"
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name, "text0", "text1"]


def test_a_cache_from_another_version_or_layout_is_not_used(calibrated):
    """Another ringlet version's calibration is saved under another name and never read; a
    file whose key names another version or layout, at this job's own path, is ignored (not an
    error, no warning) and replaced."""
    path, text = calibrated
    older = run(QUICK + """
    import ringlet._version
    ringlet._version.__version__ = "0.0.1-older"
    """ + AUTO_CALL, path.parent)
    assert older.count("source: calibrated now") == 2, older
    assert cache_file(older) != path and len(list(path.parent.iterdir())) == 2
    data = json.loads(text)
    for other in ({"ringlet": "0.0.1-older"}, {"hosts": ["elsewhere"], "nodes": [0, 1]},
                  {"ranks_per_host": [1, 1], "size": 2}):
        data["key"] = {**json.loads(text)["key"], **other}
        data["parameters"]["alpha"] = 1.0  # would be absurd if it were used
        path.write_text(json.dumps(data))
        output = run(QUICK + AUTO_CALL, path.parent)
        assert output.count("source: calibrated now") == 2 and WARNING not in output, (other,
                                                                                        output)
        assert json.loads(path.read_text())["parameters"]["alpha"] != 1.0


def test_an_unwritable_cache_directory_warns_and_runs(tmp_path):
    """A cache directory that cannot be made (a file is in the way): calibrated, used, not
    saved, with a warning; never a crash."""
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    output = run(QUICK + AUTO_CALL, blocker)
    assert output.count("source: calibrated now") == 2, output
    assert output.count("cannot save calibration") == 1, output
