"""Load task examples from local files through HF `datasets` and normalise them.

Formats (`format=`):
- "gsm8k": `question`, `answer` = "<rationale> #### N"; the reference answer is the text after the
  last "####" with thousands commas removed; `solution` is the rationale.
- "math": MATH / PRM800K / DeepScaleR style: `problem`, and `answer` when present, else the last
  `\\boxed{}` of `solution`.
- "generic": `question_field` / `answer_field` named in the config (defaults "prompt" or "question",
  and "answer"). The question may also be a list of chat messages (`{"role", "content"}` dicts);
  it is kept as `messages` and `question` is the last user turn.
- "ifeval": IFEval rows (Zhou et al. 2023, arXiv 2311.07911; google/IFEval's columns): `key`,
  `prompt`, `instruction_id_list` (non-empty list of instruction ids) and `kwargs` (one dict, or
  null, per instruction), kept as they are for the IFEval rewards; an optional `response` column
  is the reference response (`answer`, the SFT target). IFEval has no reference answers, so
  without it `answer` is "" (train such a task with `sft.steps = 0`).
- "auto": "math" when there is a `problem` column, "ifeval" with an `instruction_id_list` column,
  "gsm8k" when `question`/`answer` answers carry "####", else "generic".

Files: `.jsonl`, `.json` (list of rows, or an object with one list of rows), `.parquet`, `.csv`,
or a folder written by `Dataset.save_to_disk` / `DatasetDict.save_to_disk` (pick `split`); any
other folder is a `MalformedRowError` naming it. Everything is local; set HF_DATASETS_OFFLINE=1 to
be sure nothing is fetched. HF `datasets` caches the Arrow conversion of a file under a
fingerprint of its path and modification time, so a file rewritten with its old time kept
(`cp -p`, `rsync -a`, `tar x`) would read as its old rows: the cache of a file is therefore kept
under a SHA-256 of its bytes (`content_cache_dir`), and new content is always read anew.

A normalised example is a dict with `id` (str), `question` (str), `prompt` (= question, the
docs/ARCHITECTURE.md name), `answer` (str, non-empty except IFEval rows') and `solution` (str) when
the source has one, `instruction_id_list` / `kwargs` for IFEval rows, plus any `extra_fields` copied
as they are. Malformed rows (missing or empty field, a non-string question, a non-string non-numeric
answer, no extractable answer, a line of a `.jsonl` that is not valid JSON) raise
`MalformedRowError` naming the file and row index (`on_malformed="error"`), or are skipped and
listed in the `LoadReport` (`on_malformed="skip"`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from essa_jax.rewards.extraction import find_boxed

log = logging.getLogger(__name__)

FORMATS = ("auto", "gsm8k", "math", "ifeval", "generic")
ON_MALFORMED = ("error", "skip")
_ID_FIELDS = ("id", "unique_id", "idx", "problem_id", "key")


class MalformedRowError(ValueError):
    """A row of a task file cannot be turned into an example; the message names file and row."""


@dataclasses.dataclass
class LoadReport:
    """What `load_examples` read: rows seen, examples kept, and (row index, reason) skipped."""

    path: str
    format: str
    rows: int = 0
    kept: int = 0
    skipped: list[tuple[int, str]] = dataclasses.field(default_factory=list)

    @property
    def num_skipped(self) -> int:
        return len(self.skipped)

    def summary(self) -> str:
        msg = f"{self.path}: {self.kept}/{self.rows} rows kept ({self.format} format)"
        if self.skipped:
            first = "; ".join(f"row {i}: {r}" for i, r in self.skipped[:3])
            msg += f", {self.num_skipped} malformed rows skipped (first: {first})"
        return msg


# ---------------------------------------------------------------------------------------------
# reading rows


@dataclasses.dataclass(frozen=True)
class UnparsableRow:
    """A line of a `.jsonl` file that is not valid JSON, read with `on_malformed="skip"`: it keeps
    its place among the rows (so later rows keep their indices) and `normalise_rows` skips and
    counts it like any other malformed row."""

    line: int
    error: str


def _rows_from_python_json(path: Path, on_malformed: str = "error") -> list[Any]:
    """Plain-json reader: the fallback when Arrow cannot unify the column types of a file (one
    malformed row with a list where strings are expected) or cannot parse a line, so the row can
    be named. A `.jsonl` line that is not JSON raises, or with `on_malformed="skip"` becomes an
    `UnparsableRow` in its place."""
    text = path.read_text()
    if path.suffix.lower() == ".jsonl":
        rows: list[Any] = []
        for i, line in enumerate(text.splitlines()):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    if on_malformed == "skip":
                        rows.append(UnparsableRow(i + 1, str(e)))
                        continue
                    raise MalformedRowError(
                        f"{path}: line {i + 1} is not valid JSON: {e} (to skip such lines, set "
                        "--config.task.on_malformed=skip)"
                    ) from e
        return rows
    data = json.loads(text)
    if isinstance(data, dict):
        lists = [v for v in data.values() if isinstance(v, list)]
        if len(lists) != 1:
            raise MalformedRowError(
                f"{path}: a JSON object file must hold exactly one list of rows; found "
                f"{len(lists)} list-valued keys ({sorted(data)})"
            )
        data = lists[0]
    if not isinstance(data, list):
        raise MalformedRowError(f"{path}: expected a list of rows, got {type(data).__name__}")
    return data


def read_rows(
    path: str | os.PathLike,
    *,
    split: str | None = None,
    cache_dir: str | None = None,
    on_malformed: str = "error",
) -> list[Any]:
    """Raw rows (dicts) of a local task file or `save_to_disk` folder, via HF `datasets`.

    With `on_malformed="skip"` a `.jsonl` line that is not valid JSON is returned as an
    `UnparsableRow` in its place (`normalise_rows` skips and counts it); else it raises
    `MalformedRowError` naming the line."""
    import datasets

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"task data {path} does not exist")
    if path.is_dir():
        try:
            ds = datasets.load_from_disk(str(path))
        except FileNotFoundError:
            raise MalformedRowError(
                f"{path}: a folder that Dataset.save_to_disk / DatasetDict.save_to_disk did not "
                f"write (no dataset_info.json / dataset_dict.json); valid task data: a "
                f"{' / '.join(sorted(BUILDERS))} file or such a folder"
            ) from None
        if isinstance(ds, datasets.DatasetDict):
            names = list(ds.keys())
            if split is None and len(names) == 1:
                split = names[0]
            if split not in ds:
                raise MalformedRowError(
                    f"{path} is a DatasetDict with splits {names}; pass split= one of them "
                    f"(got {split!r}), or save the one split to read with Dataset.save_to_disk"
                )
            ds = ds[split]
        return ds.to_list()
    suffix = path.suffix.lower()
    if suffix not in BUILDERS:
        raise MalformedRowError(
            f"{path}: unsupported task file type {suffix!r}; valid: {sorted(BUILDERS)} or a "
            "folder written by Dataset.save_to_disk"
        )
    if path.stat().st_size == 0:
        raise MalformedRowError(f"{path}: the file is empty; a task file holds one row per example")
    if suffix != ".parquet":
        _check_utf8(path)
    header_only = suffix == ".csv" and len(path.read_text().strip().splitlines()) <= 1
    rows = [] if header_only else _read_file(path, BUILDERS[suffix], cache_dir, on_malformed)
    if not rows:
        raise MalformedRowError(
            f"{path}: no rows (a header or an empty list only); a task file holds one row per "
            "example"
        )
    return rows


# Task file suffixes and the HF datasets builder of each.
BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


def _check_utf8(path: Path) -> None:
    """Raise MalformedRowError naming the byte offset of the first non-UTF-8 byte (the readers
    would fail with a traceback deep inside Arrow)."""
    with open(path, "rb") as f:
        data = f.read()
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise MalformedRowError(
            f"{path}: line {line} (byte {e.start}) is not UTF-8 ({e.reason}); task files must be "
            "UTF-8 text (re-encode it, e.g. iconv -t utf-8)"
        ) from None


def content_cache_dir(path: str | os.PathLike, cache_dir: str | None = None) -> str:
    """The HF datasets cache folder of the file at `path`: `<cache_dir or HF's>/essa_jax_files/
    <SHA-256 of its bytes>`. HF keys its cache on path and modification time only (module
    docstring), so a rewrite that keeps the time would be served the old rows; under a folder of
    its content, a changed file never meets an old cache entry, and equal files share one."""
    import datasets

    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    base = cache_dir or str(datasets.config.HF_DATASETS_CACHE)
    return os.path.join(base, "essa_jax_files", digest.hexdigest())


def _read_file(
    path: Path, builder: str, cache_dir: str | None, on_malformed: str = "error"
) -> list[Any]:
    """The rows of a task file through HF `datasets` (plain JSON when Arrow cannot read it),
    cached by content (`content_cache_dir`)."""
    import datasets

    kwargs = {"cache_dir": content_cache_dir(path, cache_dir)}
    # A local file reads in a blink: no progress bars on the run's stderr (restored after), and
    # no "Failed to load JSON" log line of the builder: the plain-JSON reader below names the row.
    bars_were_off = datasets.utils.logging.is_progress_bar_enabled() is False
    verbosity = datasets.utils.logging.get_verbosity()
    datasets.disable_progress_bars()
    datasets.utils.logging.set_verbosity(datasets.utils.logging.CRITICAL)
    try:
        ds = datasets.load_dataset(builder, data_files=str(path), split="train", **kwargs)
    except Exception as e:
        if builder != "json":
            raise
        log.info("datasets could not read %s (%s); reading it as plain JSON", path, e)
        return _rows_from_python_json(path, on_malformed)
    finally:
        datasets.utils.logging.set_verbosity(verbosity)
        if not bars_were_off:
            datasets.enable_progress_bars()
    return ds.to_list()


# ---------------------------------------------------------------------------------------------
# normalising rows


class _Bad(Exception):
    """Internal: why one row is malformed."""


def _text(row: dict, field: str, what: str) -> str:
    if field not in row or row[field] is None:
        present = sorted(k for k, v in row.items() if v is not None)  # Arrow fills gaps with None
        raise _Bad(f"missing {what} field {field!r} (row has {present})")
    value = row[field]
    if not isinstance(value, str):
        raise _Bad(f"{what} field {field!r} is a {type(value).__name__}, expected a string")
    if not value.strip():
        raise _Bad(f"{what} field {field!r} is empty")
    return value


def _answer(row: dict, field: str) -> str:
    value = row.get(field)
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)  # numeric answer columns are common in generic files
    return _text(row, field, "answer").strip()


def _messages(value: Any) -> list[dict[str, str]] | None:
    if not isinstance(value, list) or not value:
        return None
    for m in value:
        if not (
            isinstance(m, dict)
            and isinstance(m.get("role"), str)
            and isinstance(m.get("content"), str)
        ):
            return None
    return [{"role": m["role"], "content": m["content"]} for m in value]


def _normalise(row: Any, fmt: str, fields: dict[str, str | None]) -> dict[str, Any]:
    if isinstance(row, UnparsableRow):
        raise _Bad(f"line {row.line} is not valid JSON: {row.error}")
    if not isinstance(row, dict):
        raise _Bad(f"row is a {type(row).__name__}, expected an object")
    ex: dict[str, Any] = {}
    if fmt == "gsm8k":
        ex["question"] = _text(row, fields["question"] or "question", "question")
        raw = _text(row, fields["answer"] or "answer", "answer")
        if "####" not in raw:
            raise _Bad("GSM8K answer has no '#### N' final answer")
        rationale, final = raw.rsplit("####", 1)
        final = final.strip().replace(",", "")
        if not final:
            raise _Bad("GSM8K answer is empty after '####'")
        ex["answer"] = final
        ex["solution"] = rationale.strip()
    elif fmt == "ifeval":
        ex.update(_ifeval_fields(row, fields["question"] or "prompt"))
    elif fmt == "math":
        ex["question"] = _text(row, fields["question"] or "problem", "problem")
        answer_field = fields["answer"] or "answer"
        sol_field = fields["solution"] or "solution"
        solution = row.get(sol_field)
        if row.get(answer_field) not in (None, ""):
            ex["answer"] = _answer(row, answer_field)
        else:
            solution = _text(row, sol_field, "solution (no answer field either)")
            boxed = [b.strip() for b in find_boxed(solution)]
            if not boxed or not boxed[-1]:
                raise _Bad(f"no {answer_field!r} field and no \\boxed{{}} answer in {sol_field!r}")
            ex["answer"] = boxed[-1]
        if isinstance(solution, str) and solution.strip():
            ex["solution"] = solution
    else:
        qf = fields["question"] or ("prompt" if "prompt" in row else "question")
        messages = _messages(row.get(qf))
        if messages is not None:
            users = [m["content"] for m in messages if m["role"] == "user"]
            if not users or not users[-1].strip():
                raise _Bad(f"chat messages in {qf!r} have no non-empty user turn")
            ex["messages"] = messages
            ex["question"] = users[-1]
        else:
            ex["question"] = _text(row, qf, "question")
        ex["answer"] = _answer(row, fields["answer"] or "answer")
        sf = fields["solution"] or "solution"
        if isinstance(row.get(sf), str) and row[sf].strip():
            ex["solution"] = row[sf]
    ex["prompt"] = ex["question"]
    return ex


def _ifeval_fields(row: dict, prompt_field: str) -> dict[str, Any]:
    """question / answer / instruction_id_list / kwargs of an IFEval row (module docstring)."""
    ids = row.get("instruction_id_list")
    if not isinstance(ids, list) or not ids or not all(isinstance(i, str) and i for i in ids):
        raise _Bad("'instruction_id_list' must be a non-empty list of instruction id strings")
    kwargs = row.get("kwargs")
    if kwargs is None:
        kwargs = [{} for _ in ids]
    if not isinstance(kwargs, list) or len(kwargs) != len(ids):
        raise _Bad(f"'kwargs' must be a list of one dict per instruction ({len(ids)})")
    if not all(k is None or isinstance(k, dict) for k in kwargs):
        raise _Bad("every 'kwargs' entry must be a dict (or null)")
    response = row.get("response")
    if response is not None and not isinstance(response, str):
        raise _Bad(f"'response' is a {type(response).__name__}, expected a string")
    return {
        "question": _text(row, prompt_field, "prompt"),
        "answer": response or "",
        "instruction_id_list": list(ids),
        # Arrow gives every row the union of the file's kwargs keys, the absent ones None; the
        # IFEval reference drops them (rewards.ifeval), so they are kept as read.
        "kwargs": [dict(k or {}) for k in kwargs],
    }


def detect_format(rows: Sequence[Any]) -> str:
    """ "math" with a `problem` column, "ifeval" with `instruction_id_list`, "gsm8k" when
    `answer`s carry "####", else "generic"."""
    sample = [r for r in rows[:50] if isinstance(r, dict)]
    if any("problem" in r for r in sample):
        return "math"
    if any("instruction_id_list" in r for r in sample):
        return "ifeval"
    answers = [r.get("answer") for r in sample if "question" in r]
    if answers and any(isinstance(a, str) and "####" in a for a in answers):
        return "gsm8k"
    return "generic"


def normalise_rows(
    rows: Iterable[Any],
    *,
    source: str,
    format: str = "auto",
    question_field: str | None = None,
    answer_field: str | None = None,
    solution_field: str | None = None,
    id_field: str | None = None,
    extra_fields: Sequence[str] = (),
    on_malformed: str = "error",
) -> tuple[list[dict[str, Any]], LoadReport]:
    """Normalise raw rows (see the module docstring); `source` names them in errors and ids."""
    if format not in FORMATS:
        raise ValueError(f"task format {format!r} is not valid; valid: {FORMATS}")
    if on_malformed not in ON_MALFORMED:
        raise ValueError(f"on_malformed={on_malformed!r} is not valid; valid: {ON_MALFORMED}")
    rows = list(rows)
    fmt = detect_format(rows) if format == "auto" else format
    fields = {"question": question_field, "answer": answer_field, "solution": solution_field}
    report = LoadReport(path=source, format=fmt, rows=len(rows))
    stem = Path(source).stem or "row"
    examples = []
    for i, row in enumerate(rows):
        try:
            ex = _normalise(row, fmt, fields)
        except _Bad as e:
            if on_malformed == "error":
                raise MalformedRowError(
                    f"{source}: row {i} (counting from 0): {e} ({fmt} format; to skip "
                    "malformed rows instead, set --config.task.on_malformed=skip, or "
                    "on_malformed='skip' in Python)"
                ) from None
            report.skipped.append((i, str(e)))
            continue
        id_key = id_field or next((k for k in _ID_FIELDS if k in row), None)
        if id_field is not None and id_field not in row:
            raise MalformedRowError(f"{source}: row {i}: missing id field {id_field!r}")
        ex["id"] = str(row[id_key]) if id_key is not None else f"{stem}-{i}"
        for f in extra_fields:
            if f in row:
                ex[f] = row[f]
        examples.append(ex)
    report.kept = len(examples)
    if not examples:
        raise MalformedRowError(
            f"{source}: no usable row: {report.rows} rows, {report.num_skipped} skipped as "
            f"malformed ({fmt} format); a task needs at least one question with its answer"
        )
    if report.skipped:
        log.warning(report.summary())
    return examples, report


def load_examples(
    path: str | os.PathLike,
    *,
    format: str = "auto",
    question_field: str | None = None,
    answer_field: str | None = None,
    solution_field: str | None = None,
    id_field: str | None = None,
    extra_fields: Sequence[str] = (),
    on_malformed: str = "error",
    split: str | None = None,
    cache_dir: str | None = None,
) -> tuple[list[dict[str, Any]], LoadReport]:
    """Read and normalise a local task file; returns (examples, report).

    Args:
      path: `.jsonl`, `.json`, `.parquet`, `.csv` file or a `save_to_disk` folder.
      format: "auto", "gsm8k", "math" or "generic" (module docstring).
      question_field / answer_field / solution_field / id_field: column names overriding the
        format's defaults (the generic mapping of the config).
      extra_fields: columns copied into each example unchanged (e.g. "level", "subject").
      on_malformed: "error" raises `MalformedRowError` naming file and row; "skip" drops the row
        and records (row index, reason) in `report.skipped`.
      split: the split of a saved DatasetDict.
      cache_dir: HF datasets cache for the converted Arrow files (default: HF's), kept under a
        folder of each file's content (`content_cache_dir`).
    """
    rows = read_rows(path, split=split, cache_dir=cache_dir, on_malformed=on_malformed)
    return normalise_rows(
        rows,
        source=str(path),
        format=format,
        question_field=question_field,
        answer_field=answer_field,
        solution_field=solution_field,
        id_field=id_field,
        extra_fields=extra_fields,
        on_malformed=on_malformed,
    )
