"""``rayfl report``: comparison tables and accuracy plots built from finished run directories.

``report`` is the one-call entry point the CLI uses; ``load_run``, ``markdown_table`` and
``plot_accuracy`` are the pieces it is made of, usable on their own. Runs from several settings also get paper
000's layouts (``rayfl.report.paper``): Table 3, the utilisation bars of Figure 6 and Figure 12's curves per setting.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from rayfl.report.atomic import replace_text
from rayfl.report.paper import (
    UTILISATION_PNG,
    paper_grid,
    plot_setting_curves,
    plot_utilisation,
    setting_of,
    table3_markdown,
    utilisation_markdown,
)
from rayfl.report.phases import phases_markdown
from rayfl.report.plots import XAxis, plot_accuracy, plot_client_accuracy
from rayfl.report.runs import RunRecords, load_run, unique_labels
from rayfl.report.tables import cost_table, markdown_table, system_table

__all__ = [
    "ACCURACY_VS_ROUNDS_PNG",
    "ACCURACY_VS_SIM_HOURS_PNG",
    "CLIENT_ACCURACY_PNG",
    "REPORT_MD",
    "UTILISATION_PNG",
    "RunRecords",
    "XAxis",
    "cost_table",
    "load_run",
    "markdown_table",
    "plot_accuracy",
    "plot_client_accuracy",
    "report",
    "unique_labels",
]

log = logging.getLogger(__name__)

ACCURACY_VS_ROUNDS_PNG = "accuracy_vs_rounds.png"
ACCURACY_VS_SIM_HOURS_PNG = "accuracy_vs_sim_hours.png"
CLIENT_ACCURACY_PNG = "client_accuracy.png"
REPORT_MD = "report.md"


def report(
    run_dirs: Sequence[Path], out_dir: Path | None = None, *, paper: bool | None = None
) -> tuple[str, list[Path]]:
    """Load ``run_dirs``, write the comparison report and its plots, and return the Markdown.

    Writes into ``out_dir`` (default: the first run directory; created if needed):

    * ``accuracy_vs_rounds.png`` — test accuracy against round index;
    * ``accuracy_vs_sim_hours.png`` — against simulated hours, only when some run has nonzero simulated time;
    * ``client_accuracy.png`` — a box plot of each run's per-client accuracies, when some run recorded them;
    * with the paper layouts: ``utilisation.png`` (Figure 6) and, per setting, ``accuracy_vs_rounds_<setting>.png``
      and ``accuracy_vs_sim_hours_<setting>.png`` (Figure 12);
    * ``report.md`` — the returned Markdown text (a heading, the table, the client-accuracy and training-cost table
      when some run recorded training MACs or per-client accuracies, with the paper layouts Table 3 and the
      utilisation table, links to the plots, each multi-phase run's phases with their per-tier results, and each
      run's per-round system table).

    Args:
        run_dirs: the run directories to compare, in table/legend order.
        out_dir: where to write; None means ``run_dirs[0]``.
        paper: add paper 000's layouts (``rayfl.report.paper``); None adds them when the runs come from more than one
            setting.

    Returns:
        ``(markdown, png_paths)``: the text written to ``report.md`` and the PNG files written, in the
        order above.

    Raises:
        ValueError: ``run_dirs`` is empty.
        FileNotFoundError: an entry is not a run directory (see ``load_run``).
    """
    if not run_dirs:
        raise ValueError("report needs at least one run directory")
    runs = [load_run(run_dir) for run_dir in run_dirs]
    target = Path(out_dir) if out_dir is not None else Path(run_dirs[0])
    target.mkdir(parents=True, exist_ok=True)

    pngs = [plot_accuracy(runs, target / ACCURACY_VS_ROUNDS_PNG, x="round_idx")]
    if any(run.sim_time_s > 0 for run in runs):
        pngs.append(plot_accuracy(runs, target / ACCURACY_VS_SIM_HOURS_PNG, x="sim_hours"))

    sections = ["# rayfl report", "", markdown_table(runs)]
    for png in pngs:
        sections.append(f"![{png.stem.replace('_', ' ')}]({png.name})")
        sections.append("")
    if paper is None:
        paper = len({setting_of(run) for run in runs}) > 1
    if any(run.total_train_macs is not None or run.client_accs() is not None for run in runs):
        sections += ["## Client accuracy and training cost (paper 002)", "", cost_table(runs)]
        if any(run.client_accs() is not None for run in runs):
            box = plot_client_accuracy(runs, target / CLIENT_ACCURACY_PNG)
            sections += [f"![client accuracy]({box.name})", ""]
            pngs.append(box)
    if paper:
        pngs += _paper_sections(runs, target, sections)
    for label, run in zip(unique_labels(runs), runs, strict=True):
        phases = phases_markdown(run)
        if phases is not None:
            sections += [f"## {label}: phases", "", phases]
    for label, run in zip(unique_labels(runs), runs, strict=True):
        table = system_table(run)
        if table is not None:
            sections += [f"## {label}: simulated time, utilisation and failures per round", "", table]
    markdown = "\n".join(sections).rstrip("\n") + "\n"

    md_path = target / REPORT_MD
    replace_text(md_path, markdown)  # a report.md that is a symlink is replaced by a file, never written through
    log.info("wrote %s and %d plot(s) for %d run(s)", md_path, len(pngs), len(runs))
    return markdown, pngs


def _paper_sections(runs: Sequence[RunRecords], target: Path, sections: list[str]) -> list[Path]:
    """Append paper 000's layouts to ``sections`` and write their figures into ``target``."""
    grid = paper_grid(runs)
    utilisation = plot_utilisation(grid, target / UTILISATION_PNG)
    curves = plot_setting_curves(grid, target)
    sections += [
        "## Paper 000, Table 3: final test accuracy and simulated latency",
        "",
        table3_markdown(grid),
        "## Paper 000, Figure 6: mean utilisation of the clients that trained",
        "",
        utilisation_markdown(grid),
        f"![utilisation]({utilisation.name})",
        "",
        "## Paper 000, Figure 12: accuracy per setting",
        "",
    ]
    for png in curves:
        sections += [f"![{png.stem.replace('_', ' ')}]({png.name})", ""]
    return [utilisation, *curves]
