"""The package's layout is its architecture: imports run one way, between folders by role, with no
cycle, and no module grows past one role's size.

The import graph is read from the source (``ast``), every ``import`` of a distrl module counted,
those inside functions too (so that none can hide a cycle); ``if TYPE_CHECKING:`` blocks count for
cycles (a type-only cycle is still two modules that cannot be read apart) but not for the layers.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "distrl"

# Top to bottom: a module may import modules of its own layer or of the layers below it, never above.
LAYERS = [
    ("__main__", "cli", "compat"),          # entry points: the commands, the seeds' shapes
    ("runtime", "runs"),                    # what runs the data path (trainer, supervisor, evaluation); runs read back
    ("learning",),                          # the data path's second half: batches, the learner, ranks
    ("sampling",),                          # its first half: the actors, the slots and their queues
    ("config",),                            # schema, composition, validation, the host, placement
    ("nn", "intrinsic", "envs"),            # networks, intrinsic rewards, environments
    ("rollout", "utils", "version"),        # the rollout's layout; what knows nothing of RL
]
MAX_LINES = 330


def layer(module: str) -> int:
    """The layer index of ``distrl.<part>...`` (``distrl`` itself, the public API, is above all)."""
    parts = module.split(".")
    if len(parts) == 1:
        return -1
    for index, names in enumerate(LAYERS):
        if parts[1] in names:
            return index
    raise AssertionError(f"{module} is in no layer of tests/test_layout.py: add its folder to LAYERS")


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imports(path: Path, known: set[str], type_only: bool = False) -> list[tuple[str, int, bool]]:
    """``(imported distrl module, line, inside a function)`` for every import in ``path``; with
    ``type_only`` those under ``if TYPE_CHECKING:`` too."""
    tree = ast.parse(path.read_text())
    this = module_name(path)
    package = this if path.name == "__init__.py" else this.rsplit(".", 1)[0]
    found = []

    def visit(node: ast.AST, in_function: bool) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test) and not type_only:
            return
        if isinstance(node, ast.Import):
            found.extend((alias.name, node.lineno, in_function) for alias in node.names
                         if alias.name.split(".")[0] == "distrl")
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package, up level - 1 packages
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            if base.split(".")[0] == "distrl":
                for alias in node.names:  # `from distrl.sampling import logs` imports distrl.sampling.logs
                    name = f"{base}.{alias.name}"
                    found.append((name if name in known else base, node.lineno, in_function))
        for child in ast.iter_child_nodes(node):
            visit(child, in_function or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef))

    visit(tree, False)
    return found


def graph() -> dict[str, set[str]]:
    found = modules()
    known = set(found)
    return {name: {target for target, _, _ in imports(path, known, type_only=True) if target != name}
            for name, path in found.items()}


def test_no_import_cycle():
    edges = graph()
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for target in sorted(edges.get(node, ())):
            if state.get(target) == 1:
                cycle = path[path.index(target):] + [target]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if target not in state:
                visit(target)
        path.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node)


def test_imports_run_down_the_layers():
    found = modules()
    known = set(found)
    upward = []
    for name, path in sorted(found.items()):
        for target, line, _ in imports(path, known):
            if target in known and layer(target) < layer(name) and not target == "distrl":
                upward.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {target}")
    assert not upward, "imports up the layers:\n" + "\n".join(upward)


def test_no_class_name_is_defined_twice():
    where: dict[str, list[str]] = {}
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                where.setdefault(node.name, []).append(name)
    twice = {cls: found for cls, found in where.items() if len(found) > 1}
    assert not twice, twice


def test_no_module_is_over_330_lines():
    long = {name: n for name, path in modules().items() if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert not long, long


def test_the_checker_sees_a_cycle_and_an_upward_import(tmp_path, monkeypatch):
    """The rules above can fail: a package with a -> b -> a, and an import of cli from utils."""
    package = tmp_path / "distrl"
    (package / "utils").mkdir(parents=True)
    (package / "cli").mkdir()
    (package / "__init__.py").write_text("")
    (package / "utils" / "__init__.py").write_text("")
    (package / "cli" / "__init__.py").write_text("")
    (package / "utils" / "a.py").write_text("def f():\n    from distrl.utils import b\n")
    (package / "utils" / "b.py").write_text("from distrl.utils.a import f\nfrom distrl.cli import c\n")
    (package / "cli" / "c.py").write_text("")
    monkeypatch.setattr(__import__(__name__), "PACKAGE", package)
    with pytest.raises(pytest.fail.Exception, match="distrl.utils.a -> distrl.utils.b -> distrl.utils.a"):
        test_no_import_cycle()
    with pytest.raises(AssertionError, match="utils/b.py:2 imports distrl.cli.c"):
        test_imports_run_down_the_layers()


def test_the_config_layer_builds_no_env():
    """Validation has no side effect: what depends on an env's spaces is checked against the spec
    distrl.runtime.preflight probes once (distrl.envs.env_spec), never by config/ building one."""
    builders = {"env_spec", "make_vector_env", "make_render_env", "make"}
    found = []
    for path in sorted((PACKAGE / "config").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("distrl.envs"):
                found += [f"{path.name} imports {a.name}" for a in node.names if a.name in builders]
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "make" \
                    and ast.unparse(node.func.value) in ("gym", "gymnasium"):
                found.append(f"{path.name}:{node.lineno} calls {ast.unparse(node.func)}")
    assert not found, found


def test_the_wheel_lists_every_package_folder():
    """pyproject.toml names the packages a wheel (and `make install`'s editable install) carries:
    a folder of distrl/ missing from it, or a name left for a folder that moved, breaks the install."""
    import tomllib

    listed = set(tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {module_name(p) for p in PACKAGE.rglob("__init__.py")}
    configs = {name for name in listed if name == "distrl.conf" or name.startswith("distrl.conf.")}
    assert listed - configs == folders


MAX_PARAMETERS = 8
# What may take more: the config schema's dataclasses mirror conf/'s YAML key for key (Hydra's structured
# configs), and distrl/compat keeps the seeds' own signatures.
WIDE_BY_DESIGN = ("distrl.config.schema", "distrl.compat")


def test_no_constructor_or_factory_takes_over_8_parameters():
    """Every class's constructor (a dataclass's or NamedTuple's fields that it takes included) and
    every factory (a classmethod, a ``make_*`` function) of distrl takes at most 8 parameters."""
    import importlib
    import inspect

    wide = {}
    for name in sorted(modules()):
        if name.startswith(WIDE_BY_DESIGN) or name == "distrl.__main__":
            continue
        module = importlib.import_module(name)
        for attr, value in vars(module).items():
            if getattr(value, "__module__", None) != name:
                continue  # imported, checked where it is defined
            makers = []
            if inspect.isclass(value):
                makers.append((attr, value))
                makers += [(f"{attr}.{k}", getattr(value, k)) for k, v in vars(value).items()
                           if isinstance(v, classmethod)]
            elif inspect.isfunction(value) and attr.startswith("make_"):
                makers.append((attr, value))
            for label, maker in makers:
                try:
                    parameters = inspect.signature(maker).parameters
                except (TypeError, ValueError):  # a builtin's
                    continue
                taken = [p for p in parameters.values() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
                if len(taken) > MAX_PARAMETERS:
                    wide[f"{name}.{label}"] = len(taken)
    assert not wide, wide
