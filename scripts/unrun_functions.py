"""`python scripts/unrun_functions.py var/coverage.json`: the functions none of whose lines ran in
a coverage run (coverage's JSON report), one `path:line name (N lines)` a line. The dead-code
proof of docs/testing.md ("Dead code") reads them against their callers by hand: a function
run only in another process or by the slow tests shows up here too."""
from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def body_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> set[int]:
    """Line numbers of the function's statements, its docstring left out."""
    body = node.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    return {sub.lineno for stmt in body for sub in ast.walk(stmt) if hasattr(sub, "lineno")}


def unrun(report: dict, root: Path = REPO) -> list[tuple[str, int, str, int]]:
    found = []
    for path, info in report["files"].items():
        if "/migrations/" in path:
            continue
        executed = set(info["executed_lines"])
        for node in ast.walk(ast.parse((root / path).read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = body_lines(node)
                if lines and not lines & executed:
                    found.append((path, node.lineno, node.name, len(lines)))
    return sorted(found)


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__.strip().splitlines()[0], file=sys.stderr)
        return 2
    for path, line, name, num_lines in unrun(json.loads(Path(sys.argv[1]).read_text())):
        print(f"{path}:{line} {name} ({num_lines} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
