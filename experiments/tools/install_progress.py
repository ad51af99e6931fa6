"""`make setup`'s progress: pip's output in, its log written whole, one status line out.

Run by the system Python before the venv has any package, so standard library only. pip says what it collected
and downloaded but not how many packages remain, so what remains is estimated from the last install's length
and package count on this machine (.venv/.install-timing.json), or on a first install from the one measured on a
fresh 2-core clone (FIRST_INSTALL_S, docs/ladder.md), and said to be that.
"""
from __future__ import annotations

import json
import re
import sys
import threading
import time
from pathlib import Path

FIRST_INSTALL_S = 60.0       # pip's step of make setup on a fresh 2-core clone, without byte-compiling
LOG_EVERY_S = 15.0
SIZE = re.compile(r"\(([\d.]+) ([kMG]B)\)")
UNITS = {"kB": 1e-3, "MB": 1.0, "GB": 1e3}


class Install:
    def __init__(self, before: dict | None, clock=time.monotonic):
        self.clock, self.started, self.before = clock, clock(), before or {}
        self.collected, self.downloaded, self.mb, self.installing = 0, 0, 0.0, 0

    def read(self, line: str) -> None:
        if line.startswith("Collecting "):
            self.collected += 1
        elif line.lstrip().startswith("Downloading "):
            self.downloaded += 1
            if m := SIZE.search(line):
                self.mb += float(m.group(1)) * UNITS[m.group(2)]
        elif line.startswith("Installing collected packages:"):
            self.installing = len(line.split(":", 1)[1].split(","))

    def remaining_s(self) -> float:
        planned = self.before.get("seconds", FIRST_INSTALL_S)
        return max(planned - (self.clock() - self.started), 0.0)

    def text(self) -> str:
        elapsed = self.clock() - self.started
        of = f"/{self.before['packages']}" if self.before.get("packages") else ""
        what = (f"installing {self.installing} packages" if self.installing else
                f"resolving: {self.collected}{of} packages collected")
        if self.downloaded:
            what += f", {self.downloaded} downloaded ({self.mb:.0f} MB)"
        basis = (f"the last install here took {self.before['seconds']:.0f} s" if self.before.get("seconds") else
                 f"a first install took about {FIRST_INSTALL_S:.0f} s on a 2-core machine")
        left = self.remaining_s()
        eta = f"about {left:.0f} s left" if left else "longer than that"
        return f"{what} · {elapsed:.0f} s in · {eta} ({basis})"


def main(log_path: str) -> int:
    timing = Path(log_path).with_name(".install-timing.json")
    before = json.loads(timing.read_text()) if timing.exists() else None
    install, tty, printed = Install(before), sys.stdout.isatty(), time.monotonic()
    lock, finished = threading.Lock(), threading.Event()

    def draw():
        with lock:
            sys.stdout.write("\r\033[K  " + install.text()[:150])
            sys.stdout.flush()

    def tick():          # pip is silent for a minute while it installs: the time still counts on the line
        while not finished.wait(1.0):
            draw()

    if tty:
        threading.Thread(target=tick, daemon=True).start()
    with open(log_path, "w") as log:
        for line in sys.stdin:
            log.write(line)
            with lock:
                install.read(line)
            if tty:
                draw()
            elif time.monotonic() - printed >= LOG_EVERY_S:
                printed = time.monotonic()
                print("  " + install.text(), flush=True)
    finished.set()
    if tty:
        with lock:
            sys.stdout.write("\r\033[K")
    seconds = time.monotonic() - install.started
    print(f"  pip: {install.installing} packages installed in {seconds:.0f} s (log: {log_path})")
    if install.installing:
        timing.write_text(json.dumps({"seconds": round(seconds), "packages": install.collected}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
