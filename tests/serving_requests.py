"""Requests for scheduler tests: a prompt of consecutive token ids, and waiting for one to finish cleanly."""
from experiments.core.request import Prompt


def prompt(i, n_in, n_out, start=5):
    return Prompt(i, tuple(range(start, start + n_in)), n_out)


def wait(rec, timeout=60):
    assert rec.done.wait(timeout), "request did not finish"
    assert rec.error is None, rec.error
