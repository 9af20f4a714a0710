"""scripts/plot-bench: the bench scripts' records (BENCH_JSON, scripts/benchlib.py's record) and
the figures transcribed from BENCHMARKS.md (docs/bench/*.json) drawn as PNG charts. Run with the
tests' own interpreter, whose matplotlib scripts/setup installs (python3-matplotlib)."""
import json
import struct
import subprocess
import sys
from pathlib import Path

from ckptfs_testlib import REPO

PLOT = REPO / "scripts" / "plot-bench"
DOCS = REPO / "docs" / "bench"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

sys.path.insert(0, str(REPO / "scripts"))
import benchlib  # noqa: E402


def plot(*args):
    return subprocess.run([sys.executable, str(PLOT), *map(str, args)], capture_output=True,
                          text=True, timeout=300)


def png_size(path):
    """(width, height) of a PNG file, once its signature and IHDR chunk are checked."""
    data = Path(path).read_bytes()
    assert data[:8] == PNG_SIGNATURE, path
    assert data[12:16] == b"IHDR", path
    return struct.unpack(">II", data[16:24])


def test_bench_records_and_transcribed_figures_become_charts(tmp_path, monkeypatch):
    """Records as a bench appends them (every run), and an object of transcribed medians with
    their min-max: one PNG a chart, named by it, of a real picture's size."""
    runs = tmp_path / "runs.jsonl"
    monkeypatch.setenv("BENCH_JSON", str(runs))
    for cache, shift in (("page cache hot", 0.0), ("page cache cold", -1.0)):
        benchlib.record("host-load", "ckload.load(pack)", cache, [4.1 + shift, 4.5 + shift, 3.9],
                        unit="GB/s", better="higher", title="sample host load")
        benchlib.record("host-load", "a peer", cache, [1.0, 1.2 + shift / 4], unit="GB/s")
    benchlib.record("mount-latency", "mount", "page cache hot", [7.0, 7.3, 6.9], unit="ms",
                    better="lower", title="sample latency")
    lines = [json.loads(line) for line in runs.read_text().splitlines()]
    assert len(lines) == 5 and lines[0]["runs"] == [4.1, 4.5, 3.9]
    assert {"command", "date", "machine"} <= set(lines[0])
    transcribed = tmp_path / "transcribed.json"
    transcribed.write_text(json.dumps({
        "about": "a sample", "chart": "http-sequential", "title": "sample remote read",
        "unit": "MB/s", "command": "scripts/bench-http", "commit": "0000000",
        "records": [{"row": "loopback", "series": "URL mount", "median": 1617},
                    {"row": "loopback", "series": "curl -o FILE", "median": 839, "min": 800,
                     "max": 900},
                    {"row": "1gbit", "series": "URL mount", "median": 125}]}))
    out = tmp_path / "png"
    p = plot("-o", out, runs, transcribed)
    assert p.returncode == 0, p.stderr
    names = {"host-load", "mount-latency", "http-sequential"}
    assert p.stdout.split() == [str(out / f"{n}.png") for n in
                                ("host-load", "mount-latency", "http-sequential")]
    assert {f.name for f in out.iterdir()} == {f"{n}.png" for n in names}
    for n in names:
        width, height = png_size(out / f"{n}.png")
        assert width >= 400 and height >= 150, (n, width, height)
        assert (out / f"{n}.png").stat().st_size > 5000, n


def test_input_of_another_shape_is_refused(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"rows": []}))
    p = plot("-o", tmp_path / "png", bad)
    assert p.returncode != 0 and "plot-bench: " in p.stderr and str(bad) in p.stderr, p.stderr
    assert not (tmp_path / "png").exists()


def test_the_committed_charts(tmp_path):
    """Each transcribed file in docs/bench says where its figures come from, renders, and has
    its committed PNG beside it, small enough for the repository (< 100 KB)."""
    sources = sorted(DOCS.glob("*.json"))
    assert {s.stem for s in sources} == {"host-load", "mount-reads", "http-sequential",
                                         "mount-latency"}
    for s in sources:
        doc = json.loads(s.read_text())
        assert "BENCHMARKS.md" in doc["about"] and doc["command"] and doc["date"], s
        png = DOCS / f"{s.stem}.png"
        png_size(png)
        assert 5000 < png.stat().st_size < 100_000, png
    p = plot("-o", tmp_path, *sources)
    assert p.returncode == 0, p.stderr
    assert sorted(f.name for f in tmp_path.iterdir()) == sorted(f"{s.stem}.png"
                                                              for s in sources)
