"""Assertions on a rung's recorded verdict that fail when the gate decides wrongly or without saying why: an
`in ("accepted", "rejected")` passes a gate that rejects everything."""

GATE = "roi.gate."
NOT_CRITERIA = {"roi.gate.first_measurement", "roi.gate.interleaved",   # how it was measured, not a criterion
                "roi.gate.recorded_again"}


def criteria(data) -> dict[str, str]:
    """criterion name -> its tag (`pass: ...` or `FAIL: ...`), from a rung run's data."""
    return {k[len(GATE):]: v for k, v in data.tags.items() if k.startswith(GATE) and k not in NOT_CRITERIA}


def assert_decided(data, name: str = "", passes=()) -> None:
    """Gated on criteria; accepted only with every one passing; rejected with the detail of a failing one as its
    reason; undecided with none failing and one undecided. `passes`: criteria that must pass whatever the verdict
    (an exact engine swap's fidelity)."""
    tags, judged = data.tags, criteria(data)
    verdict, reason = tags["roi.verdict"], tags["roi.reason"]
    assert verdict in ("accepted", "rejected", "undecided"), (name, verdict, reason)
    assert judged, (name, "no gate criterion recorded", reason)
    failed = {c: t for c, t in judged.items() if t.startswith("FAIL")}
    open_ = {c: t for c, t in judged.items() if t.startswith("undecided")}
    if verdict == "accepted":
        assert not failed and not open_, (name, failed, open_)
    elif verdict == "undecided":
        assert open_ and not failed, (name, "undecided", judged)
        assert any(t.removeprefix("undecided: ")[:60] in reason for t in open_.values()), (name, reason, open_)
    else:
        assert failed, (name, "rejected with every criterion passing", judged)
        assert any(t.removeprefix("FAIL: ")[:60] in reason for t in failed.values()), (name, reason, failed)
    for c in passes:
        assert judged.get(c, "").startswith("pass"), (name, c, judged.get(c))
