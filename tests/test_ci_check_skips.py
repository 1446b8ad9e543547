"""``.ci/check_skips.py``: only CUDA-only skips pass; a missing package or any other skip fails the run."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap

from helpers import REPO

_SPEC = importlib.util.spec_from_file_location("check_skips", REPO / ".ci" / "check_skips.py")
check_skips = sys.modules.setdefault("check_skips", importlib.util.module_from_spec(_SPEC))
_SPEC.loader.exec_module(check_skips)

_TESTS = {
    "test_cuda.py": """
        import pytest
        @pytest.mark.skipif(True, reason="needs CUDA")
        def test_on_gpu(): pass
        def test_runs(): pass
        @pytest.mark.xfail(reason="known")
        def test_expected_failure(): assert False
    """,
    "test_package.py": """
        import pytest
        pytest.importorskip("hotloop_no_such_package")
        def test_uses_it(): pass
    """,
    "test_other.py": """
        import pytest
        def test_quietly_skipped(): pytest.skip("data not found")
    """,
}


def _report(tmp_path, names):
    """Run pytest on the chosen test files in ``tmp_path``; the JUnit XML report's path."""
    for name in names:
        (tmp_path / name).write_text(textwrap.dedent(_TESTS[name]))
    junit = tmp_path / "junit.xml"
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}",
                    *names], cwd=tmp_path, capture_output=True, timeout=120, check=False)
    return junit


def test_cuda_only_skips_pass_and_any_other_skip_fails(tmp_path, capsys):
    junit = _report(tmp_path, sorted(_TESTS))
    skips = {s.test.rsplit("::", 1)[-1].split(".")[-1]: s.reason for s in check_skips.read_skips(junit)}
    assert set(skips) == {"test_on_gpu", "test_package", "test_quietly_skipped"}     # xfail is no skip
    assert "hotloop_no_such_package" in skips["test_package"]                  # a module skipped at collection
    assert check_skips.main([str(junit)]) == 1
    out = capsys.readouterr().out
    assert "3 skipped, 1 expected, 2 unexpected" in out
    assert "UNEXPECTED" in out and "data not found" in out and "hotloop_no_such_package" in out
    assert check_skips.main([str(junit), "--allow", "data not found"]) == 1   # the missing package still fails

    (tmp_path / "cuda").mkdir()
    assert check_skips.main([str(_report(tmp_path / "cuda", ["test_cuda.py"]))]) == 0


def test_a_missing_package_fails_even_when_its_reason_names_cuda():
    skips = [check_skips.Skip("t::a", "could not import 'pycuda' (the CUDA bindings): No module named 'pycuda'"),
             check_skips.Skip("t::b", "needs a GPU"), check_skips.Skip("t::c", "needs CUDA"),
             check_skips.Skip("t::e", "FSDP over NCCL needs 2 GPUs"), check_skips.Skip("t::f", "glibc only")]
    assert [s.test for s in check_skips.unexpected(skips)] == ["t::a", "t::f"]
    assert check_skips.unexpected([check_skips.Skip("t::d", "this CPU has no bf16 LSTM")],
                                  ["this CPU has no bf16 LSTM"]) == []


def test_an_unreadable_report_is_an_error(tmp_path):
    (tmp_path / "junit.xml").write_text("<testsuites")
    assert check_skips.main([str(tmp_path / "junit.xml")]) == 2


#: import names of [test]-extra distributions whose import name is not the distribution's name
_IMPORT_NAMES = {"pyyaml": "yaml"}


def test_no_test_imports_skip_a_package_the_test_extra_installs():
    """``importorskip`` of a package that ``pip install -e ".[test]"`` installs would turn a broken
    install into a green run of skips; those tests import it (a failure is a failure)."""
    import re
    import tomllib
    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["test"]
    installed = {_IMPORT_NAMES.get(name, name).replace("-", "_").lower()
                 for name in (re.split(r"[<>=!~\[; ]", spec)[0] for spec in extra)}
    found = []
    for path in sorted((REPO / "tests").rglob("*.py")):
        if path.name in ("test_ci_check_skips.py", "mutations.py"):
            continue
        for module in re.findall(r"importorskip\(\s*[\"']([\w.]+)[\"']", path.read_text(encoding="utf-8")):
            if module.split(".")[0].lower() in installed:
                found.append(f"{path.relative_to(REPO)}: {module}")
    assert found == [], "importorskip of [test]-extra packages (import them instead): " + ", ".join(found)
