"""What one provider does is asked of its object, never decided by comparing its kind.

Cloud-specific behaviour lives in the Cloud objects (``skyward_iac/infra/clouds/``) and, where
the caller may not import infra/ (api/, node/, remote/), in declarative attributes and methods
of the provider spec classes (``api/providers.py``: ``on_this_machine``, ``preemption_notice``,
``identity_mount``, ``owns_store``, ``check_pool``). This test reads every module's syntax
tree and fails on a comparison of a provider-ish expression (its text names ``provider``,
``kind`` or ``cloud``) with ``"local"``, ``"aws"`` or ``"gcp"`` (``==``, ``!=``, ``in``,
``not in``, ``match``/``case``) outside the files allowed below, each with its reason.
A table keyed by kind (``{"aws": ..., "gcp": ...}``) is not flagged: it is data one object
holds, not a decision spread over callers.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import skyward_iac
from skyward_iac import cli

PACKAGE = Path(skyward_iac.__file__).parent
KINDS = frozenset({"local", "aws", "gcp"})
#: Files that may compare a provider's kind, and why.
ALLOWED = {
    "infra/clouds/": "the Cloud objects are where each provider's answers live",
    "api/providers.py": "the provider spec classes declare their own kind and attributes",
}
PROVIDERISH = ("provider", "kind", "cloud")


def _kinds_in(node: ast.AST) -> set[str]:
    """The provider kinds a literal (a string, or a tuple/list/set of them) names."""
    if isinstance(node, ast.Constant) and node.value in KINDS:
        return {node.value}
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return {e.value for e in node.elts if isinstance(e, ast.Constant) and e.value in KINDS}
    return set()


def _providerish(node: ast.AST) -> bool:
    text = ast.unparse(node).lower()
    return any(word in text for word in PROVIDERISH)


def branches(tree: ast.AST) -> list[tuple[int, str]]:
    """Each comparison of a provider-ish expression with a provider kind: (line, source)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(_kinds_in(o) for o in operands) and any(
                    _providerish(o) for o in operands if not _kinds_in(o)):
                found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Match) and _providerish(node.subject):
            for case in node.cases:
                for sub in ast.walk(case.pattern):
                    if isinstance(sub, ast.MatchValue) and _kinds_in(sub.value):
                        found.append((case.pattern.lineno, ast.unparse(node.subject)))
    return sorted(found)


def _allowed(relative: str) -> bool:
    return any(relative.startswith(prefix) for prefix in ALLOWED)


def test_no_provider_kind_branches_outside_the_provider_objects() -> None:
    offending = [
        f"skyward_iac/{relative}:{line}: {source}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if not _allowed(relative := path.relative_to(PACKAGE).as_posix())
        for line, source in branches(ast.parse(path.read_text(), str(path)))
    ]
    assert not offending, (
        "branches on a provider's kind; ask its object instead (infra/clouds/ on the client "
        "side, an attribute of the spec class in api/providers.py where infra/ cannot be "
        "imported):\n" + "\n".join(offending))


def test_the_scan_sees_each_form_of_branch() -> None:
    """The scan is not vacuous: each form it must catch is caught, and look-alikes are not."""
    caught = """
if spec.provider.kind == "local": pass
if provider != "aws": pass
if args.provider in ("aws", "gcp"): pass
if self.cloud not in ["gcp"]: pass
match plan.provider:
    case "gcp": pass
"""
    assert [line for line, _ in branches(ast.parse(caught))] == [2, 3, 4, 5, 7]
    missed = """
if plan.skyward_source == "local": pass
if kind == "s3-keys": pass
table = {"aws": 1, "gcp": 2}
"""
    assert branches(ast.parse(missed)) == []


def test_allowed_files_exist() -> None:
    """An allowance for a file that is gone would hide nothing but mislead the reader."""
    for prefix in ALLOWED:
        assert (PACKAGE / prefix).exists(), prefix


@pytest.mark.parametrize(("argv", "settings"), [
    (["--provider", "gcp", "--project", "p", "--zone", "us-central1-a", "--ssh-cidr",
      "10.0.0.0/8"], {"project": "p", "zone": "us-central1-a", "sshCidr": "10.0.0.0/8"}),
    (["--provider", "aws", "--ssh-cidr", "10.0.0.0/8"], {"sshCidr": "10.0.0.0/8"}),
    (["--provider", "local"], {}),
])
def test_preview_takes_the_flags_its_provider_knows(argv: list[str],
                                                    settings: dict[str, str]) -> None:
    """``preview``'s provider flags follow each provider's stack settings (no kind branch)."""
    from skyward_iac.cli_commands.preview import _settings

    args = cli.parser("preview").parse_args(["preview", *argv])
    given = _settings(args)
    assert {k: v for k, v in given.items() if k in ("project", "zone", "sshCidr")} == settings


@pytest.mark.parametrize(("argv", "refused"), [
    (["--provider", "local", "--zone", "z", "--ssh-cidr", "10.0.0.0/8"], "zone, sshCidr"),
    (["--provider", "aws", "--project", "p"], "project"),  # AWS has no project: was ignored
])
def test_preview_refuses_flags_its_provider_lacks(argv: list[str], refused: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    from skyward_iac.cli_commands.preview import _settings

    args = cli.parser("preview").parse_args(["preview", *argv])
    with pytest.raises(SystemExit):
        _settings(args)
    assert f"--provider {argv[1]} takes no {refused}" in capsys.readouterr().err
