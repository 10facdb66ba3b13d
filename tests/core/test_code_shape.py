"""The shape of the code under app/, read from its syntax trees: forward hooks are attached in
one place (`app/core/hooks.py`), no function, class or file is too long to read at once (150,
350 and 800 lines), the check's path
crosses from app/core/health into app/core/fixing, never back by import, and the precision plan
and the fixes never name an encoder kind (a kind declares the layers it keeps wider itself).

Each checker is first run on a planted violation, so that a checker that found nothing would
fail here rather than pass over the tree."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# The one module that calls torch's hook registrations (`app.core.hooks.Hooks`).
HOOKS_MODULE = "app/core/hooks.py"
# torch's registrations of hooks run around a module's call, per module and global.
HOOK_REGISTRATIONS = frozenset(
    {
        "register_forward_pre_hook",
        "register_forward_hook",
        "register_full_backward_pre_hook",
        "register_full_backward_hook",
        "register_backward_hook",
        "register_module_forward_pre_hook",
        "register_module_forward_hook",
        "register_module_full_backward_pre_hook",
        "register_module_full_backward_hook",
        "register_module_backward_hook",
    }
)
LONGEST_FUNCTION = 150  # lines, from `def` to the function's last line
LONGEST_CLASS = 350  # lines, from `class` to the class's last line
LONGEST_FILE = 800  # lines
HEALTH = "app.core.health"
# The packages that ask an encoder kind for its own islands (`encoders.kinds.own_islands`) and
# never name one, and the kind they once named (strings may: its public setting's key).
KIND_BLIND = ("app/core/precision", "app/core/fixing")
ENCODER_KIND = "t5"
# The stages written once for the check and generation (`run.stages.Stages`): no class outside
# the run package defines one. A family's VAE step (`Family.decode(vae, latents)`, what the
# stage calls) and a low-bit test weight's decode (`lowbit._Weights.decode`) are no stages.
RUN_PACKAGE = "app/core/run/"
SHARED_STAGES = frozenset({"encode_picture", "decode"})
NOT_STAGES = ("app/core/families/", "app/core/precision/lowbit.py")
# The run path's packages, whose classes compose their parts rather than stack them: a class
# there builds on at most one class of these packages, itself built on none (generation's job
# once stacked `Job(Repairs(Probes(JobStages)))`).
RUN_PATH = ("app/core/run/", "app/core/generation/", "app/core/health/", "app/core/fixing/")


def _sources(root: Path, under: Path) -> Iterator[tuple[str, ast.Module]]:
    """Each .py file under `under`: its path from `root` and its syntax tree."""
    for path in sorted(under.rglob("*.py")):
        where = path.relative_to(root).as_posix()
        yield where, ast.parse(path.read_text(encoding="utf-8"), filename=where)


def _module_name(where: str) -> str:
    """The dotted module name of a file path relative to the root (a package's `__init__` as
    the package)."""
    parts = where.removesuffix(".py").split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def hook_registrations(tree: ast.AST, where: str) -> list[str]:
    """file:line of each use of a hook registration in `tree`: a call or reference
    (`m.register_forward_hook`), a name imported (`register_module_forward_hook`), or a name
    looked up by string (`getattr(m, "register_forward_hook")`)."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            names = [node.attr]
        elif isinstance(node, ast.Name):
            names = [node.id]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names = [node.value]
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [alias.name.rpartition(".")[2] for alias in node.names]
        else:
            continue
        if any(name in HOOK_REGISTRATIONS for name in names):
            lines.add(getattr(node, "lineno", 0))
    return [f"{where}:{line}" for line in sorted(lines)]


def long_functions(tree: ast.AST, where: str) -> list[tuple[int, str]]:
    """(length, "file:line qualified name") of each function or method in `tree` longer than
    `LONGEST_FUNCTION` lines, counted from its `def` (decorators excluded) to its last line."""
    found: list[tuple[int, str]] = []

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = (child.end_lineno or child.lineno) - child.lineno + 1
                if length > LONGEST_FUNCTION:
                    found.append((length, f"{where}:{child.lineno} {prefix}{child.name}"))
                walk(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                walk(child, f"{prefix}{child.name}.")
            else:
                walk(child, prefix)

    walk(tree, "")
    return found


def imported_modules(tree: ast.AST, module: str, is_package: bool) -> list[tuple[int, str]]:
    """(line, absolute name) of every module the module `module` imports, wherever the import
    stands (module level, a function, `if TYPE_CHECKING:`): relative imports resolved, each
    name of `from a import b` also as `a.b` (it may be a submodule), and
    `importlib.import_module` of a literal name."""
    package = module.split(".") if is_package else module.split(".")[:-1]
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            source = ".".join(base + ([node.module] if node.module else []))
            found.append((node.lineno, source))
            found += [(node.lineno, f"{source}.{alias.name}") for alias in node.names]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, (ast.Attribute, ast.Name))
            and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id)
            == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.append((node.lineno, node.args[0].value))
    return found


def health_imports(tree: ast.AST, where: str) -> list[str]:
    """file:line: name of each import of app.core.health (or a module in it) in `tree`."""
    module = _module_name(where)
    hits = {
        (line, name)
        for line, name in imported_modules(tree, module, where.endswith("/__init__.py"))
        if name == HEALTH or name.startswith(HEALTH + ".")
    }
    return [f"{where}:{line}: {name}" for line, name in sorted(hits)]


def identifiers(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """(line, name) of every identifier in `tree`: names, attributes, definitions, parameters,
    keywords, and the modules and names an import takes (strings and comments are not)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            yield node.lineno, node.id
        elif isinstance(node, ast.Attribute):
            yield node.lineno, node.attr
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield node.lineno, node.name
        elif isinstance(node, (ast.arg, ast.keyword)) and node.arg:
            yield node.lineno, node.arg
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.lineno, node.module
        elif isinstance(node, ast.alias):
            yield node.lineno, node.name
            if node.asname:
                yield node.lineno, node.asname


def encoder_kind_named(root: Path) -> list[str]:
    """file:line: identifier of each identifier naming `ENCODER_KIND` (in any case) in a module
    under `root`'s `KIND_BLIND` packages."""
    found = set()
    for package in KIND_BLIND:
        for where, tree in _sources(root, root / package):
            found |= {
                (where, line, name)
                for line, name in identifiers(tree)
                if ENCODER_KIND in name.lower()
            }
    return [f"{where}:{line}: {name}" for where, line, name in sorted(found)]


def hooks_attached_outside_the_hooks_module(root: Path) -> list[str]:
    """file:line of each hook registration under `root`/app but in `HOOKS_MODULE`."""
    return [
        hit
        for where, tree in _sources(root, root / "app")
        if where != HOOKS_MODULE
        for hit in hook_registrations(tree, where)
    ]


def too_long_functions(root: Path) -> list[tuple[int, str]]:
    """The functions under `root`/app longer than `LONGEST_FUNCTION` lines, longest first."""
    found = [
        hit for where, tree in _sources(root, root / "app") for hit in long_functions(tree, where)
    ]
    return sorted(found, key=lambda hit: (-hit[0], hit[1]))


def too_long_classes_and_files(root: Path) -> list[tuple[int, str]]:
    """The classes longer than `LONGEST_CLASS` lines and the files longer than `LONGEST_FILE`
    under `root`/app, longest first (a file as its path, a class as `path:line Name`)."""
    found = []
    for path in sorted((root / "app").rglob("*.py")):
        where = path.relative_to(root).as_posix()
        source = path.read_text(encoding="utf-8")
        lines = len(source.splitlines())
        if lines > LONGEST_FILE:
            found.append((lines, where))
        for node in ast.walk(ast.parse(source, filename=where)):
            if isinstance(node, ast.ClassDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > LONGEST_CLASS:
                    found.append((length, f"{where}:{node.lineno} {node.name}"))
    return sorted(found, key=lambda hit: (-hit[0], hit[1]))


def health_imported_by_fixing(root: Path) -> list[str]:
    """Each import of app.core.health by a module under `root`/app/core/fixing."""
    under = root / "app" / "core" / "fixing"
    return [hit for where, tree in _sources(root, under) for hit in health_imports(tree, where)]


def stages_defined_outside_run(root: Path) -> list[str]:
    """file:line Class.name of each `SHARED_STAGES` method (or class attribute) a class under
    `root`/app defines outside `RUN_PACKAGE` (and `NOT_STAGES`), nested classes included."""
    found = []
    for where, tree in _sources(root, root / "app"):
        if where.startswith(RUN_PACKAGE) or where.startswith(NOT_STAGES):
            continue
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef):
                continue
            for child in node.body:
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    names = [(child.lineno, child.name)]
                elif isinstance(child, (ast.Assign, ast.AnnAssign)):
                    targets = child.targets if isinstance(child, ast.Assign) else [child.target]
                    names = [(t.lineno, t.id) for t in targets if isinstance(t, ast.Name)]
                else:
                    continue
                found += [
                    f"{where}:{line} {node.name}.{name}"
                    for line, name in names
                    if name in SHARED_STAGES
                ]
    return sorted(found)


def stacked_classes(root: Path) -> list[str]:
    """file:line Class of each class under `RUN_PATH` whose base, itself one of those packages'
    classes, builds on another of them (bases named by their last name)."""
    bases: dict[str, list[str]] = {}
    defined: dict[str, str] = {}
    for where, tree in _sources(root, root / "app"):
        if not where.startswith(RUN_PATH):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                named = [
                    b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases
                ]
                bases[node.name] = [b for b in named if b]
                defined[node.name] = f"{where}:{node.lineno} {node.name}"
    return sorted(
        defined[name]
        for name, own in bases.items()
        if any(any(b in bases for b in bases.get(base, [])) for base in own if base in bases)
    )


def _plant(root: Path, where: str, source: str) -> None:
    path = root / where
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source, encoding="utf-8")


def test_forward_hooks_are_attached_only_through_the_hooks_module(tmp_path):
    _plant(tmp_path, HOOKS_MODULE, (ROOT / HOOKS_MODULE).read_text(encoding="utf-8"))
    _plant(
        tmp_path,
        "app/core/planted.py",
        "import torch\n"
        "from torch.nn.modules.module import register_module_forward_hook\n"
        "def watch(layer, fn, hooks):\n"
        "    hooks.before(layer, fn, first=True)\n"
        "    layer.register_forward_pre_hook(fn, prepend=True)\n"
        "    attach = getattr(layer, 'register_full_backward_hook')\n"
        "    return torch.nn.modules.module.register_module_forward_pre_hook(fn)\n",
    )
    assert hooks_attached_outside_the_hooks_module(tmp_path) == [
        "app/core/planted.py:2",
        "app/core/planted.py:5",
        "app/core/planted.py:6",
        "app/core/planted.py:7",
    ]

    offenders = hooks_attached_outside_the_hooks_module(ROOT)
    assert not offenders, (
        "forward hooks attached outside app/core/hooks.py (attach them through a `Hooks` set): "
        + ", ".join(offenders)
    )


def test_no_function_is_longer_than_150_lines(tmp_path):
    line = "    total = 1\n"
    _plant(
        tmp_path,
        "app/core/planted.py",
        "class Job:\n"
        "    @staticmethod\n"
        "    @functools.cache\n"
        "    def as_long_as_allowed():  # its decorators are not counted\n"
        + ("    " + line) * (LONGEST_FUNCTION - 1)
        + "\ndef too_long():\n"
        + line * LONGEST_FUNCTION,
    )
    _plant(
        tmp_path,
        "app/ui/nested.py",
        "def outer():\n    def inner():\n" + ("    " + line) * LONGEST_FUNCTION,
    )
    assert too_long_functions(tmp_path) == [
        (LONGEST_FUNCTION + 2, "app/ui/nested.py:1 outer"),
        (LONGEST_FUNCTION + 1, f"app/core/planted.py:{LONGEST_FUNCTION + 5} too_long"),
        (LONGEST_FUNCTION + 1, "app/ui/nested.py:2 outer.inner"),
    ]

    found = too_long_functions(ROOT)
    assert not found, (
        f"functions longer than {LONGEST_FUNCTION} lines, longest first: "
        + ", ".join(f"{name} ({length} lines)" for length, name in found)
    )


def test_no_class_or_file_is_too_long(tmp_path):
    line = "    total = 1\n"
    _plant(
        tmp_path,
        "app/core/planted.py",
        "class Small:\n" + line * (LONGEST_CLASS - 1) + "class Large:\n" + line * LONGEST_CLASS,
    )
    _plant(tmp_path, "app/ui/long.py", "total = 1\n" * (LONGEST_FILE + 1))
    assert too_long_classes_and_files(tmp_path) == [
        (LONGEST_FILE + 1, "app/ui/long.py"),
        (LONGEST_CLASS + 1, f"app/core/planted.py:{LONGEST_CLASS + 1} Large"),
    ]

    found = too_long_classes_and_files(ROOT)
    assert not found, "too long, longest first: " + ", ".join(
        f"{name} ({length} lines)" for length, name in found
    )


def test_fixing_never_imports_health(tmp_path):
    source = (ROOT / "app/core/fixing/diagnosis.py").read_text(encoding="utf-8")
    after = source.count("\n")
    _plant(
        tmp_path,
        "app/core/fixing/diagnosis.py",
        source + "\n"
        "def verdict():\n"
        "    from app.core.fixing import layer_islands\n"
        "    from app.core.healthy import words\n"
        "    from app.core import health\n"
        "    from ..health.words import VERDICTS\n"
        "    import app.core.health.check as check\n"
        "    return importlib.import_module('app.core.health.report')\n",
    )
    relative = "from ..health import check\n"
    _plant(tmp_path, "app/core/fixing/__init__.py", relative)  # app.core.health
    _plant(tmp_path, "app/core/fixing/inner/__init__.py", relative)  # app.core.fixing.health
    _plant(tmp_path, "app/core/fixing/inner/part.py", relative)  # app.core.fixing.health
    _plant(tmp_path, "app/core/health/check.py", "from app.core.fixing import diagnosis\n")
    assert health_imported_by_fixing(tmp_path) == [
        "app/core/fixing/__init__.py:1: app.core.health",
        "app/core/fixing/__init__.py:1: app.core.health.check",
        f"app/core/fixing/diagnosis.py:{after + 5}: app.core.health",
        f"app/core/fixing/diagnosis.py:{after + 6}: app.core.health.words",
        f"app/core/fixing/diagnosis.py:{after + 6}: app.core.health.words.VERDICTS",
        f"app/core/fixing/diagnosis.py:{after + 7}: app.core.health.check",
        f"app/core/fixing/diagnosis.py:{after + 8}: app.core.health.report",
    ]

    offenders = health_imported_by_fixing(ROOT)
    assert not offenders, (
        "app/core/fixing imports app/core/health (health calls into fixing, never the reverse): "
        + ", ".join(offenders)
    )


def test_the_plan_and_the_fixes_never_name_an_encoder_kind(tmp_path):
    _plant(
        tmp_path,
        "app/core/precision/planted.py",
        '"""Keeps the T5 feed-forward in fp32."""\n'
        "from app.core.encoders import t5\n"
        "import app.core.encoders.t5 as encoder\n"
        "from app.core.encoders.kinds import own_island as T5_island\n"
        "# T5 keeps its wo in fp32\n"
        "def island(plan, key='t5_fp32_feed_forward'):\n"
        "    return plan.t5_feed_forward, own_island(key), {'t5_fp32_feed_forward': True}\n",
    )
    _plant(
        tmp_path,
        "app/core/fixing/inner/planted.py",
        "class T5Fix:\n"
        "    def build(self, isT5=False):\n"
        "        return replace(self, kind_islands=isT5, t5Kind=1)\n",
    )
    _plant(tmp_path, "app/core/encoders/t5.py", "def is_t5(module):\n    return True\n")
    assert encoder_kind_named(tmp_path) == [
        "app/core/fixing/inner/planted.py:1: T5Fix",
        "app/core/fixing/inner/planted.py:2: isT5",
        "app/core/fixing/inner/planted.py:3: isT5",
        "app/core/fixing/inner/planted.py:3: t5Kind",
        "app/core/precision/planted.py:2: t5",
        "app/core/precision/planted.py:3: app.core.encoders.t5",
        "app/core/precision/planted.py:4: T5_island",
        "app/core/precision/planted.py:7: t5_feed_forward",
    ]

    offenders = encoder_kind_named(ROOT)
    assert not offenders, (
        "app/core/precision or app/core/fixing names an encoder kind (ask the kind for its own "
        "islands, `encoders.kinds.own_islands`): " + ", ".join(offenders)
    )


def test_no_class_outside_the_run_package_defines_a_shared_stage(tmp_path):
    _plant(
        tmp_path,
        "app/core/health/planted.py",
        "class Runner:\n"
        "    def encode(self, plan):\n"  # a stage's inputs may be picked by its composer
        "        return self.stages.encode(plan)\n"
        "    def decode(self, plan, latents):\n"
        "        return latents\n"
        "    class Inner:\n"
        "        encode_picture = staticmethod(print)\n"
        "def decode(latents):\n"  # a function, no class's stage
        "    return latents\n",
    )
    _plant(tmp_path, "app/core/generation/job.py", "class Job:\n    def decode(self): ...\n")
    _plant(tmp_path, "app/core/run/stages.py", "class Stages:\n    def decode(self): ...\n")
    _plant(tmp_path, "app/core/families/base.py", "class Family:\n    def decode(self): ...\n")
    assert stages_defined_outside_run(tmp_path) == [
        "app/core/generation/job.py:2 Job.decode",
        "app/core/health/planted.py:4 Runner.decode",
        "app/core/health/planted.py:7 Inner.encode_picture",
    ]

    offenders = stages_defined_outside_run(ROOT)
    assert not offenders, (
        "a stage written outside app/core/run (compose `run.stages.Stages`): "
        + ", ".join(offenders)
    )


def test_the_run_paths_classes_compose_their_parts_rather_than_stack_them(tmp_path):
    _plant(
        tmp_path,
        "app/core/generation/planted.py",
        "class JobStages:\n    pass\nclass Probes(JobStages):\n    pass\n"
        "class Repairs(Probes):\n    pass\nclass Job(Repairs):\n    pass\n",
    )
    _plant(tmp_path, "app/core/families/base.py", "class A:\n    pass\nclass B(A):\n    pass\n")
    _plant(tmp_path, "app/core/families/c.py", "class C(B):\n    pass\n")  # families may
    assert stacked_classes(tmp_path) == [
        "app/core/generation/planted.py:5 Repairs",
        "app/core/generation/planted.py:7 Job",
    ]

    offenders = stacked_classes(ROOT)
    assert not offenders, (
        "a run-path class built on a chain of the run path's classes (compose the parts): "
        + ", ".join(offenders)
    )


def test_the_check_and_a_generation_call_the_same_stage_code(tmp_path, monkeypatch):
    """A check and a generation of the demo model encode the prompt and decode their latents
    through `run.stages.Stages` alone: each stage's call is that class's, whoever watches it
    (the check's recorders, a generation's NaN watch)."""
    from app.core import health
    from app.core.generation import GenerationRequest, generate
    from app.core.health.request import CheckRequest
    from app.core.models import load_model
    from app.core.run import stages
    from app.core.settings import PrecisionSettings

    calls: list[tuple[str, str]] = []
    for name in ("encode", "decode", "denoise_probe", "denoise_loop"):
        real = getattr(stages.Stages, name)

        def spied(self, *args, _real=real, _name=name, **kwargs):
            calls.append((_name, type(self._run.__self__).__name__))
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(stages.Stages, name, spied)
    model = load_model("demo")
    fp32 = PrecisionSettings(precision="fp32")
    health.check_loaded(model, CheckRequest(precision=fp32, device="cpu", size=64))
    checked = list(calls)
    calls.clear()
    request = GenerationRequest(
        prompt="a red circle", steps=2, width=64, height=64, seed=1, output_dir=str(tmp_path)
    )
    generate(model, request, precision=fp32, device="cpu")
    assert checked == [("encode", "Runner"), ("denoise_probe", "Runner"), ("decode", "Runner")]
    assert calls == [("encode", "Job"), ("denoise_loop", "Job"), ("decode", "Job")]
