"""scripts/unrun_functions.py: the dead-code proof's reader of a coverage report."""
from scripts.unrun_functions import unrun

SOURCE = '''def ran():
    """Docstring lines do not count."""
    return 1


def never():
    """Only its docstring would count, and it does not."""
    x = 1
    return x


class A:
    async def method(self):
        return 2
'''


def test_functions_none_of_whose_lines_ran_are_listed(tmp_path):
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "mod.py").write_text(SOURCE)
    (tmp_path / "app" / "migrations").mkdir()
    (tmp_path / "app" / "migrations" / "0001.py").write_text(SOURCE)
    report = {"files": {"app/mod.py": {"executed_lines": [1, 3, 6, 13]},
                        "app/migrations/0001.py": {"executed_lines": []}}}
    assert unrun(report, root=tmp_path) == [("app/mod.py", 6, "never", 2),
                                            ("app/mod.py", 13, "method", 1)]
