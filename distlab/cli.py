"""The ``distlab`` command: run benchmark notebooks and the demo (the quickstart) headless."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from distlab.errors import DistlabError


def _value(text: str) -> Any:
    """Parse a ``-p key value`` value as YAML (numbers, lists, booleans), else keep the string."""
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def _params(pairs: list[list[str]] | None) -> dict[str, Any]:
    return {k: _value(v) for k, v in (pairs or [])}


def cmd_bench(args: argparse.Namespace) -> int:
    from distlab import bench

    if args.list or not args.name:
        names = bench.available()
        print("\n".join(names) if names else "no benchmarks under notebooks/bench/")
        return 0
    result = bench.run_bench(args.name, _params(args.param), out_dir=args.out, progress=not args.quiet)
    print(bench.format_result(result))
    print(f"\nexecuted notebook and figures: {Path(args.out) / args.name}.ipynb, .json")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """Execute notebooks/quickstart.ipynb with papermill and export it to HTML under ``out``."""
    from distlab.notebook.execute import execute_notebook, export_html

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    src = Path(__file__).resolve().parent.parent / "notebooks" / "quickstart.ipynb"
    executed = execute_notebook(src, out / "quickstart.ipynb", _params(args.param), progress=not args.quiet)
    html = export_html(executed, out / "quickstart.html")
    print(f"demo done: {executed} and {html}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="distlab", description="Plan, simulate and launch distributed training.")
    sub = p.add_subparsers(dest="command", required=True)

    b = sub.add_parser("bench", help="run a benchmark notebook (notebooks/bench/NAME.ipynb)")
    b.add_argument("name", nargs="?")
    b.add_argument("-p", "--param", nargs=2, action="append", metavar=("KEY", "VALUE"))
    b.add_argument("--list", action="store_true", help="list the benchmarks")
    b.add_argument("--out", default="out/bench")
    b.add_argument("-q", "--quiet", action="store_true")
    b.set_defaults(func=cmd_bench)

    d = sub.add_parser("demo", help="run the quickstart notebook (the main job) into OUT")
    d.add_argument("--out", default="out")
    d.add_argument("-p", "--param", nargs=2, action="append", metavar=("KEY", "VALUE"))
    d.add_argument("-q", "--quiet", action="store_true")
    d.set_defaults(func=cmd_demo)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except DistlabError as exc:
        print(f"distlab: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
