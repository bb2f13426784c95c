"""`finetune-studio inspect FILE...`: what a job would make of some data, in the terminal.

The same report as `POST /datasets/inspect` (the same code: `inspection/child.py`,
run in this process; no server is needed): the shape, the rows, the first rows as
the model sees them with the part the loss covers marked, token statistics (with
--model), and every problem with its file and line. Exit status 0 when a job would
train on the data as it is, 1 when it has problems, 2 for a request that cannot be
made (no file, a bad --mapping).

`render(report, out)` writes the text report; it takes the stream, so tests read
exactly what a user sees.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Optional, TextIO

if TYPE_CHECKING:
    from finetune_studio.schemas import DatasetInspection

EXIT_OK, EXIT_PROBLEMS, EXIT_USAGE = 0, 1, 2
# How a preview line says what the loss does with it.
MARKS = {(True, False): "+", (False, False): "-", (True, True): "x", (False, True): "x"}
LEGEND = "(+ the loss covers it, - it does not, x cut off by max_seq_length)"
ROLE_WIDTH = 9


def run_inspect(args: Any, out: TextIO, err: TextIO) -> int:
    """The command: build the request from the arguments, inspect, print."""
    from pydantic import ValidationError

    from finetune_studio.inspection.child import run_inspection
    from finetune_studio.schemas import DatasetInspectRequest

    try:
        mapping = parse_mapping(args.mapping or [])
        request = DatasetInspectRequest(
            local_datasets=list(args.files),
            format_type=args.format,
            model_name=args.model,
            max_seq_length=args.max_seq_length,
            custom_format_mapping=mapping,
            train_on_completions=args.train_on_completions,
            bad_rows=args.bad_rows,
            preview_rows=args.rows,
            trust_remote_code=args.trust_remote_code,
        )
    except (ValueError, ValidationError) as exc:
        errors = exc.errors() if isinstance(exc, ValidationError) else [{"loc": (), "msg": str(exc)}]
        for error in errors:
            where = ".".join(str(part) for part in error["loc"])
            print(f"error: {where + ': ' if where else ''}{error['msg']}", file=err)
        return EXIT_USAGE
    report = run_inspection(request)
    if args.output_json:
        out.write(report.model_dump_json(indent=2) + "\n")
    else:
        render(report, out)
    return EXIT_OK if report.ok and not report.problems else EXIT_PROBLEMS


def parse_mapping(items: list[str]) -> Optional[dict[str, str]]:
    """--mapping COLUMN=ROLE (repeated) as a custom_format_mapping, in the order given."""
    mapping: dict[str, str] = {}
    for item in items:
        column, sep, role = item.rpartition("=")
        if not sep or not column or not role:
            raise ValueError(f"--mapping takes COLUMN=ROLE (e.g. question=user), not {item!r}")
        mapping[column] = role
    return mapping or None


def render(report: DatasetInspection, out: TextIO) -> None:
    """The report as text."""
    say = out.write
    if report.shape:
        how = "detected" if report.detected else "as asked"
        say(f"{report.rows:,} rows to train on, {report.shape} ({how}); {report.read:,} read")
        left = [(report.skipped_rows, "bad rows skipped"), (report.dropped_rows, "empty conversations left out")]
        say("".join(f", {count:,} {what}" for count, what in left if count) + "\n")
        for source, count in report.per_file.items():
            say(f"  {source}: {count:,} records ({report.shapes.get(source, '?')})\n")
    if report.tokens is not None:
        t = report.tokens
        say(
            f"tokens per row: min {t.min:,}, mean {t.mean:,.1f}, p50 {t.p50:,.0f}, p90 {t.p90:,.0f}, p95 {t.p95:,.0f},"
            f" p99 {t.p99:,.0f}, max {t.max:,}; {t.total:,} in all\n"
        )
        say(f"longer than max_seq_length ({report.max_seq_length:,}): {report.truncated_rows or 0:,} of {report.rows:,} rows\n")
    elif report.shape:
        say("token statistics: name a model (--model) to count tokens with its tokenizer\n")
    for warning in report.warnings:
        say(f"warning: {warning}\n")
    if report.preview:
        how = "with the model's chat template" if report.rendered_with == "chat_template" else "each turn's text (no --model)"
        say(f"\nfirst rows, {how} {LEGEND}:\n" if report.rendered_with != "text" else f"\nfirst rows {LEGEND}:\n")
        for row in report.preview:
            size = f", {row.tokens:,} tokens" if row.tokens is not None else ""
            say(f"row {row.index}{size}{' (shown in part)' if row.clipped else ''}\n")
            for segment in row.segments:
                mark = MARKS[(segment.trains, segment.truncated)]
                role = (segment.role or "").ljust(ROLE_WIDTH)
                for line in segment.text.splitlines() or [""]:
                    say(f"  {mark} {role}| {line}\n")
    if report.problem_counts:  # bad rows (a problem with a whole source is the error itself, below)
        counts = ", ".join(f"{kind} {count:,}" for kind, count in report.problem_counts.items())
        say(f"\nproblems{f' ({counts})' if counts else ''}:\n")
        for problem in report.problems:
            location = ", ".join(part for part in (problem.file, problem.where) if part)
            say(f"  {location}: {problem.problem}\n")
    if report.error:
        say(f"\nerror ({report.error_code}): a job would end with: {report.error}\n")
    if report.suggested_mapping:
        flags = " ".join(f"--mapping {json.dumps(f'{column}={role}')}" for column, role in report.suggested_mapping.items())
        say(f"\nsuggested custom_format_mapping: {json.dumps(report.suggested_mapping)}\n  try: {flags}\n")
    if report.ok and not report.problems:
        say("\nok: a job would train on this data as it is\n")
