"""What a reviewer reads in the MLflow UI: the runs table rather than MLflow 3's GenAI landing page, the sweep's
description (the ladder table, the champion, the commands that follow), each rung's verdict and criteria as
its description, and one self-contained HTML report on the sweep's run."""
from __future__ import annotations

import base64
import html
import io

from experiments.record.outcome import RungOutcome, markdown_table, table_columns

DESCRIPTION = "mlflow.note.content"   # what the run page shows as the run's description


def sweep_description(outcomes: list[RungOutcome], champion: RungOutcome | None, top: int, target: str,
                      versus: str = "") -> str:
    if champion is None:
        head = "**No champion**: the baseline did not complete, so no rung could be gated."
        follow = ""
    else:
        head = (f"**Champion: `{champion.name}`** (run `{champion.run_id}`), after {len(outcomes)} rungs: "
                f"{_count(outcomes)}.")
        follow = ("\n\nPromote it to the registry (alias `champion`, with a rollback tag): "
                  f"`make promote RUN={champion.run_id} target={target}`  \n"
                  f"Roll back later: `make rollback target={target}`; see where it stands: `make status target={target}`.")
    if versus:
        head += f"\n\n{versus}"
    return (f"{head}\n\n{markdown_table(outcomes, top)}\nEach rung was gated against the champion of its time "
            f"(deltas in the console table are against it); `report.html` on this run has the table and the "
            f"plots.{follow}\n")


def rung_description(outcome: RungOutcome) -> str:
    v = outcome.verdict
    before = outcome.champion_before
    lines = [f"**{v.status}**: {v.reason}", ""]
    if before is not None:
        lines.append(f"Gated against the champion `{before.name}` (run `{before.run_id}`).")
    if v.criteria:
        lines += ["", "| criterion | result | detail |", "|---|---|---|"]
        lines += [f"| {c.name} | {c.word if c.word != 'FAIL' else '**FAIL**'} | {c.detail} |" for c in v.criteria]
    return "\n".join(lines) + "\n"


def html_report(title: str, outcomes: list[RungOutcome], top: int, figures: dict) -> str:
    """The ladder table and the sweep's plots in one file that MLflow's artefact viewer renders."""
    columns = table_columns(outcomes, top)
    head = "".join(f"<th>{html.escape(h)}</th>" for h in ("rung", "verdict", *(h for _, h, _ in columns),
                                                           "gated against", "reason"))
    rows = []
    for o in outcomes:
        s = o.summary(top)
        cells = "".join(f"<td class=num>{(f % s[k]) if k in s else '–'}</td>" for k, _, f in columns)
        against = o.champion_before.name if o.champion_before else "–"
        rows.append(f"<tr class={o.verdict.status}><td>{html.escape(o.name)}</td><td>{o.verdict.status}</td>{cells}"
                    f"<td>{html.escape(against)}</td><td>{html.escape(o.verdict.reason)}</td></tr>")
    plots = "".join(f"<figure><img alt='{html.escape(name)}' src='data:image/png;base64,{_png(fig)}'>"
                    f"<figcaption>{html.escape(name)}</figcaption></figure>" for name, fig in figures.items())
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>{html.escape(title)}</title><style>
body{{font-family:sans-serif;margin:1.5em}} table{{border-collapse:collapse}} td,th{{border:1px solid #ccc;padding:4px 8px}}
td.num{{text-align:right}} tr.accepted td:nth-child(2){{color:green}} tr.rejected td:nth-child(2){{color:#b00}}
tr.failed td:nth-child(2){{color:#000;font-weight:bold}} tr.skipped td:nth-child(2){{color:#888}}
tr.undecided td:nth-child(2){{color:#c60}}
figure{{display:inline-block;margin:1em}} img{{max-width:760px}}
</style></head><body><h1>{html.escape(title)}</h1><table><tr>{head}</tr>{''.join(rows)}</table>{plots}</body></html>
"""


def _count(outcomes: list[RungOutcome]) -> str:
    counts: dict[str, int] = {}
    for o in outcomes:
        counts[o.verdict.status] = counts.get(o.verdict.status, 0) + 1
    return ", ".join(f"{n} {status}" for status, n in counts.items())


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    return base64.b64encode(buf.getvalue()).decode()
