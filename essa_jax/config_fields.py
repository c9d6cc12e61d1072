"""Every field of the experiment schema with its comment: what `--print_config` prints.

The comments live in one place, above (or beside) each field in `essa_jax.config.base_config()`;
this module reads them from that function's source (`field_comments`), so a field documented there
is documented here with no second copy to keep in step. A comment block directly above a field
(no blank line between) and any comment on the field's own lines belong to it; a block above a
section (`c.model = ml_collections.ConfigDict()`) belongs to the section.
"""

from __future__ import annotations

import ast
import functools
import inspect
import io
import textwrap
import tokenize
from collections.abc import Callable
from typing import Any

from essa_jax import config as config_lib


def _dotted(node: ast.expr) -> str | None:
    """ "model.path" for the target `c.model.path`; None for anything else (e.g. `c` itself)."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.insert(0, node.attr)
        node = node.value
    if not parts or not isinstance(node, ast.Name):
        return None
    return ".".join(parts)


def comments_of(fn: Callable[..., Any]) -> dict[str, str]:
    """{dotted field: comment} of every `c.<field> = ...` assignment in `fn`'s source, in source
    order (fields without a comment map to "")."""
    source = textwrap.dedent(inspect.getsource(fn))
    lines = source.splitlines()
    comment = {
        tok.start[0]: tok.string.lstrip("#").strip()
        for tok in tokenize.generate_tokens(io.StringIO(source).readline)
        if tok.type == tokenize.COMMENT
    }
    assigns = [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Assign)]
    out = {}
    for node in sorted(assigns, key=lambda n: n.lineno):
        path = _dotted(node.targets[0]) if len(node.targets) == 1 else None
        if path is None:
            continue
        above, line = [], node.lineno - 1
        while line in comment and lines[line - 1].lstrip().startswith("#"):
            above.insert(0, comment[line])
            line -= 1
        inline = [comment[n] for n in range(node.lineno, node.end_lineno + 1) if n in comment]
        out[path] = " ".join(above + inline)
    return out


@functools.cache
def field_comments() -> dict[str, str]:
    """{dotted field: comment} of the schema, `essa_jax.config.base_config`, in its order."""
    return comments_of(config_lib.base_config)


def _fields(config: Any, prefix: str = "") -> list[tuple[str, Any, bool]]:
    """(dotted path, value, is a section) of every section and field of `config`."""
    out = []
    for key in config.keys():
        value, path = config[key], prefix + key
        if hasattr(value, "keys"):
            out += [(path, None, True)] + _fields(value, path + ".")
        else:
            out.append((path, value, False))
    return out


def describe_config(config: Any, width: int = 100) -> str:
    """Every field of `config` (a ConfigDict of the schema) as `field = value`, with the schema's
    comment of the field wrapped below it; sections as `[section]`; the schema's order, then any
    field the schema does not document."""
    comments = field_comments()
    order = {path: i for i, path in enumerate(comments)}
    fields = sorted(_fields(config), key=lambda f: (order.get(f[0], len(order)), f[0]))
    out = []
    for path, value, is_section in fields:
        out.append(f"[{path}]" if is_section else f"{path} = {value!r}")
        if comments.get(path):
            pad = " " * 4
            text = textwrap.fill(comments[path], width, initial_indent=pad,
                                 subsequent_indent=pad, break_on_hyphens=False)  # fmt: skip
            out.append(text)
    return "\n".join(out)
