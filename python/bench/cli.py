"""The command line of run.py (no torch: CI tests it)."""

import argparse
import pathlib
import sys

from . import config


class UsageError(ValueError):
    """A bad command line; the message says what and what is allowed."""


def parser(doc):
    ap = argparse.ArgumentParser(prog="run.py", description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("outdirs", nargs="*", type=pathlib.Path, metavar="OUTDIR",
                    help="the output directory (created); with --report, one or more to merge")
    ap.add_argument("--workloads", default=",".join(config.WORKLOADS),
                    help=f"comma-separated, of {','.join(config.WORKLOADS)} (default: all)")
    ap.add_argument("--allocators", default=",".join(config.ALLOCATORS),
                    help=f"comma-separated, of {','.join(config.ALLOCATORS)} (default: all; the graphs workload adds "
                         f"{config.RETENTION} after flare)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="processes per (workload, allocator), in alternating order (default 1)")
    ap.add_argument("--quick", action="store_true", help="small sizes, few steps: a GPU smoke test (under 2 minutes)")
    ap.add_argument("--tiny", action="store_true", help="a tiny model: the CPU smoke test (with --device cpu)")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                    help="cuda (default) or cpu (the smoke test: the flare allocators are skipped)")
    ap.add_argument("--timeout", type=int, default=0, help="seconds per child (default: per workload, config.TIMEOUTS)")
    ap.add_argument("--deadline", type=int, default=0,
                    help="seconds for the whole run (default: none): each child's timeout is cut to what is left, "
                         "and runs that no longer fit are recorded as skipped, so that the report is always written")
    ap.add_argument("--runs-dir", type=pathlib.Path,
                    help="where each child writes its own JSON (default OUTDIR/runs); results.json holds every run "
                         "too, so a directory outside OUTDIR leaves OUTDIR with a few files (the device tool brings "
                         "back at most 8)")
    ap.add_argument("--warn-only", action="store_true",
                    help="deterministic algorithms in warn-only mode (flash attention's backward is then not deterministic)")
    ap.add_argument("--no-budget", action="store_true", help="skip the largest-size search under the memory budget")
    ap.add_argument("--report", action="store_true",
                    help="only re-make results.json, report.md and the PNGs from the OUTDIRs' JSON (merging them)")
    ap.add_argument("--into", type=pathlib.Path, help="with --report: where to write (default: the first OUTDIR)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    return ap


def validate(a):
    """Checks and normalises the parsed arguments; raises UsageError."""
    if a.report:
        if not a.outdirs:
            raise UsageError("--report needs at least one OUTDIR")
        missing = [str(d) for d in a.outdirs if not d.is_dir()]
        if missing:
            raise UsageError(f"no such directory: {', '.join(missing)}")
        a.into = a.into or a.outdirs[0]
        return a
    if a.into is not None:
        raise UsageError("--into goes with --report")
    if a.runs_dir is not None and a.report:
        raise UsageError("--runs-dir does not go with --report")
    if len(a.outdirs) != 1:
        raise UsageError(f"one OUTDIR expected, got {len(a.outdirs)}")
    a.outdir = a.outdirs[0]
    try:
        a.workloads = config.parse_list(a.workloads, config.WORKLOADS, "workload")
        a.allocators = config.parse_list(a.allocators, config.ALLOCATORS, "allocator")
    except ValueError as e:
        raise UsageError(str(e)) from None
    if a.rounds < 1:
        raise UsageError(f"--rounds must be at least 1, not {a.rounds}")
    if a.timeout < 0:
        raise UsageError(f"--timeout must be positive, not {a.timeout}")
    if a.deadline < 0:
        raise UsageError(f"--deadline must be positive, not {a.deadline}")
    if a.quick and a.tiny:
        raise UsageError("--quick and --tiny are two sizes: choose one")
    return a


def parse(argv, doc=""):
    """The validated arguments; UsageError for a bad command line (argparse's own
    errors exit with status 2, as usual)."""
    return validate(parser(doc).parse_args(argv))


def main(argv, doc):
    if "--child" in argv:
        from . import child  # noqa: PLC0415

        child.main(argv[argv.index("--child") + 1])
        return 0
    ap = parser(doc)
    try:
        a = validate(ap.parse_args(argv))
    except UsageError as e:
        ap.error(str(e))
    if a.report:
        from . import report  # noqa: PLC0415

        summary = report.write_all(a.outdirs, a.into, pictures=True)
        print(f"wrote {a.into / 'results.json'}, {a.into / 'report.md'} ({len(summary)} workloads)")
        return 0
    from . import parent  # noqa: PLC0415

    return parent.main(a)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], ""))
