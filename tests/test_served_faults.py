"""A serving engine's faults after its server starts, against tests/fake_server.py behind the real ServedEngine:
a flag the server rejects, a server that dies during a level, Ctrl-C (a real SIGINT) while it starts. Each is
one error in the server's own words, and nothing of the server is left running."""
from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
from omegaconf import OmegaConf
from test_server_process import FAKE, group, group_ended, wait_for

from experiments.core.recipe import Candidate, Target
from experiments.core.request import Prompt
from experiments.measure.load_ladder import run_ladder
from experiments.serving.backends.served import ServedEngine
from experiments.serving.server_process import ServerFailed
from experiments.serving.servers import serve
from experiments.targets.workload import Workload

pytestmark = pytest.mark.timeout(60)
WORKLOAD = Workload(prompts=tuple(Prompt(i, (10 + i, 20, 30), 6) for i in range(8)),
                    warmup=(Prompt(100, (50, 7), 6),))
LOAD = OmegaConf.create({"concurrency": [2], "warmup_requests": 1, "warmup_s": 0.0, "min_requests": 4,
                         "min_duration_s": 4.0, "max_duration_s": 10.0, "request_timeout_s": 5.0})


class FakeServed(ServedEngine):
    """The stand-in server as a serving engine: the same start, endpoint, pause and stop as vLLM's."""
    name = "fake-served"
    startup_timeout_s = 20.0
    flags: tuple[str, ...] = ()

    @classmethod
    def refuses(cls, cand):
        return None

    def server_command(self, cand, threads):
        return [sys.executable, FAKE, "--port", "{port}", "--model", cand.target.name, *self.flags], {}


def served(tmp_path, *flags: str) -> FakeServed:
    engine = type("Flagged", (FakeServed,), {"flags": flags})
    return engine(Candidate(Target(f"fake-{tmp_path.name}", "causal-lm", tmp_path)), 1, tmp_path)


def servers_of(name: str) -> list[psutil.Process]:
    return [p for p in psutil.process_iter(["cmdline"]) if name in " ".join(p.info["cmdline"] or [])]


def test_a_flag_the_server_rejects_is_one_error_in_its_own_words(tmp_path):
    with pytest.raises(ServerFailed, match="exited with code 2") as failed:
        served(tmp_path, "--no-such-flag")
    assert "unrecognized arguments: --no-such-flag" in str(failed.value)
    assert servers_of(f"fake-{tmp_path.name}") == []


def test_a_server_that_dies_during_a_level_fails_the_level_by_name(tmp_path):
    engine = served(tmp_path, "--crash-after", "2.5", "--token-ms", "20")
    server = serve(engine)
    try:
        with pytest.raises(ServerFailed, match="(?s)exited with code 7 during the level at concurrency 2; "
                                               ".*segfault in the fake kernel"):
            run_ladder(server, WORKLOAD, LOAD)
    finally:
        server.close()
        engine.close()
    assert group_ended(engine.process.pid)


def test_a_healthy_fake_level_is_measured(tmp_path):
    """The control for the test above: the same level, no crash, no error."""
    engine = served(tmp_path, "--token-ms", "5")
    server = serve(engine)
    try:
        level = run_ladder(server, WORKLOAD, LOAD).level(2)
    finally:
        server.close()
        engine.close()
    assert level.error_rate == 0 and level.n_ok >= 4 and group_ended(engine.process.pid)


STARTER = textwrap.dedent("""
    import sys
    from pathlib import Path
    sys.path.insert(0, {tests!r})
    from test_served_faults import served
    served(Path({tmp!r}), "--never-healthy", "--spawn-child")
""")


def test_ctrl_c_while_a_served_engine_starts_ends_its_whole_group(tmp_path):
    name = f"fake-{tmp_path.name}"
    code = STARTER.format(tests=str(Path(__file__).parent), tmp=str(tmp_path))
    starter = subprocess.Popen([sys.executable, "-c", code],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert wait_for(lambda: len(servers_of(name)) == 1, 20), "the stand-in server never started"
        pgid = servers_of(name)[0].pid
        assert wait_for(lambda: len(group(pgid)) == 2, 10), "its worker never started"
        time.sleep(0.5)                                   # inside start()'s health poll
        starter.send_signal(signal.SIGINT)
        out, _ = starter.communicate(timeout=30)
    finally:
        if starter.poll() is None:
            starter.kill()
    assert starter.returncode != 0 and "KeyboardInterrupt" in out
    assert wait_for(lambda: group(pgid) == [], 10) and servers_of(name) == []
