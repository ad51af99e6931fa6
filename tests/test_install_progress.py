"""make setup's progress line (experiments/tools/install_progress.py): what pip said, counted, and what remains."""
import json
import subprocess
import sys
from pathlib import Path

from experiments.tools.install_progress import FIRST_INSTALL_S, Install

PIP = """Obtaining file:///work/roi-ladder
Collecting torch==2.9.1 (from roi-ladder==0.1)
  Downloading torch-2.9.1-cp311-cp311-manylinux_2_28_x86_64.whl (184.5 MB)
Collecting mlflow==3.7.0 (from roi-ladder==0.1)
  Downloading mlflow-3.7.0-py3-none-any.whl (512 kB)
Collecting rich==14.2.0 (from roi-ladder==0.1)
  Using cached rich-14.2.0-py3-none-any.whl (243 kB)
Installing collected packages: rich, mlflow, torch, roi-ladder
Successfully installed mlflow-3.7.0 rich-14.2.0 roi-ladder-0.1 torch-2.9.1
""".splitlines(keepends=True)


class Clock:
    now = 0.0

    def __call__(self):
        return self.now


def test_the_line_counts_what_pip_did_and_counts_down_from_the_last_install():
    clock = Clock()
    first = Install(None, clock)
    for line in PIP[:6]:
        first.read(line)
    clock.now = 30.0
    assert first.text() == (f"resolving: 3 packages collected, 2 downloaded (185 MB) · 30 s in · about "
                            f"{FIRST_INSTALL_S - 30:.0f} s left (a first install took about {FIRST_INSTALL_S:.0f} s "
                            f"on a 2-core machine)")
    again = Install({"seconds": 100, "packages": 40}, clock)
    clock.now = 40.0
    again.read(PIP[1])
    assert again.text().startswith("resolving: 1/40 packages collected · 10 s in · about 90 s left (the last "
                                   "install here took 100 s)")
    for line in PIP[2:]:
        again.read(line)
    clock.now = 200.0
    assert again.text().startswith("installing 4 packages, 2 downloaded (185 MB) · 170 s in · longer than that")


def test_the_log_is_whole_and_the_install_is_timed_for_next_time(tmp_path):
    log = tmp_path / "pip.log"
    done = subprocess.run([sys.executable, str(Path(__file__).parents[1] / "experiments" / "tools" / "install_progress.py"),
                           str(log)], input="".join(PIP), capture_output=True, text=True, check=True)
    assert log.read_text() == "".join(PIP)
    assert "pip: 4 packages installed in" in done.stdout
    assert json.loads((tmp_path / ".install-timing.json").read_text())["packages"] == 3
