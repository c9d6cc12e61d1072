"""The layering of docs/ARCHITECTURE.md ("Layers, and who may import whom"), checked on every module
of essa_jax by reading its imports (module level and inside functions)."""

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "essa_jax"

# Layer of each top-level part of the package (docs/ARCHITECTURE.md).
LAYERS = {
    "mesh": 0,
    "distributed": 0,
    "hostmem": 0,
    "checkpointing": 0,
    "workdir": 0,
    "preemption": 0,
    "peers": 0,
    "compile_cache": 0,
    "models": 1,
    "memory": 1,
    "es": 2,
    "lora": 2,
    "rl": 2,
    "rewards": 2,
    "data": 2,
    "evaluation": 2,
    "population": 3,
    "scaling": 3,
    "config": 4,
    "config_fields": 4,
    "train": 5,
    "main": 5,
    "evaluate_lm": 5,
    "plan": 5,
    "plan_report": 5,
    "plot": 5,
    "study": 6,
}
# Extra rules beyond "no import from a higher layer".
FORBIDDEN = {
    "es": ("essa_jax.",),  # strategies know nothing about models
    "rl": ("essa_jax.lora.svd", "essa_jax.lora.policies"),
    "models": ("essa_jax.lora", "essa_jax.rl", "essa_jax.es"),
    "config": ("essa_jax.train", "essa_jax.population"),
}
ALLOWED_IN_ES = ("essa_jax.es",)


def _modules():
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG.parent).with_suffix("")
        name = ".".join(rel.parts)
        if name.endswith(".__init__"):
            name = name[: -len(".__init__")]
        yield name, path


def _imports(name: str, path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    out = set()
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.add(mod)
            out.update(f"{mod}.{a.name}" for a in node.names)
    return {m for m in out if m == "essa_jax" or m.startswith("essa_jax.")}


def _part(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def test_every_part_has_a_layer():
    parts = {_part(n) for n, _ in _modules()} - {None}
    assert parts <= set(LAYERS), sorted(parts - set(LAYERS))


@pytest.mark.parametrize("name,path", list(_modules()), ids=lambda x: str(x))
def test_imports_respect_the_layers(name, path):
    me = _part(name)
    if me is None:
        return
    for imp in _imports(name, path):
        other = _part(imp)
        if other is None or other == me or other not in LAYERS:
            continue
        assert LAYERS[other] <= LAYERS[me], f"{name} (layer {LAYERS[me]}) imports {imp}"
    for imp in _imports(name, path):
        for bad in FORBIDDEN.get(me, ()):
            if me == "es" and imp.startswith(ALLOWED_IN_ES):
                continue
            assert not (imp == bad.rstrip(".") or imp.startswith(bad)), f"{name} imports {imp}"


# lm-eval is an optional extra (`essa_jax[lmeval]`): only the lm-eval model class imports it at
# module level, and no package __init__ imports that module, so the library imports without it.
LM_EVAL_AT_IMPORT = {"essa_jax.evaluation.lm_eval_model"}


def _top_level_imports(path: Path) -> set[str]:
    out = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level:
            out.add(node.module or "")
    return out


@pytest.mark.parametrize("name,path", list(_modules()), ids=lambda x: str(x))
def test_lm_eval_stays_optional(name, path):
    top = _top_level_imports(path)
    if name not in LM_EVAL_AT_IMPORT:
        assert not any(m == "lm_eval" or m.startswith("lm_eval.") for m in top), name
    if path.name == "__init__.py":
        assert not any(m.endswith("lm_eval_model") for m in _imports(name, path)), name
