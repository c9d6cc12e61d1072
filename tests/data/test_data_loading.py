"""Loading local task files of every supported format through HF datasets."""

import json

import pytest

from essa_jax.data import MalformedRowError, load_examples, load_task

GSM8K_ROWS = [
    {
        "question": "Natalia sold clips to 48 of her friends in April, and then she sold half as "
        "many clips in May. How many clips did Natalia sell altogether in April and May?",
        "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
        "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72",
    },
    {
        "question": "A company pays $1,500 a month for 12 months. How much is that in total?",
        "answer": "1500 * 12 = <<1500*12=18000>>18,000\n#### 18,000",
    },
]
MATH_ROWS = [
    {
        "problem": "What is $\\frac{1}{2} + \\frac{1}{4}$?",
        "solution": "We have $\\frac{1}{2}+\\frac{1}{4} = \\boxed{\\frac{3}{4}}$.",
        "level": "Level 1",
        "unique_id": "test/algebra/1.json",
    },
    {
        "problem": "Compute $\\sqrt{16}$.",
        "solution": "First $\\boxed{2}$ is wrong; $\\sqrt{16} = \\boxed{4}$.",
        "level": "Level 2",
        "unique_id": "test/algebra/2.json",
    },
    {  # DeepScaleR style: an answer field takes precedence over the solution
        "problem": "How many primes are below 10?",
        "solution": "2, 3, 5, 7.",
        "answer": "4",
        "level": "Level 1",
        "unique_id": "test/nt/3.json",
    },
]


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def cache(tmp_path):
    return str(tmp_path / "hf_cache")


def test_gsm8k_jsonl(tmp_path, cache):
    path = _write_jsonl(tmp_path / "gsm8k.jsonl", GSM8K_ROWS)
    examples, report = load_examples(path, cache_dir=cache)
    assert report.format == "gsm8k" and report.kept == 2 and report.num_skipped == 0
    assert [e["answer"] for e in examples] == ["72", "18000"]
    assert examples[0]["question"] == GSM8K_ROWS[0]["question"]
    assert examples[0]["prompt"] == examples[0]["question"]
    assert examples[0]["solution"].startswith("Natalia sold 48/2")
    assert "####" not in examples[0]["solution"]
    assert [e["id"] for e in examples] == ["gsm8k-0", "gsm8k-1"]


def test_math_json_list_and_extra_fields(tmp_path, cache):
    path = tmp_path / "math.json"
    path.write_text(json.dumps(MATH_ROWS))
    examples, report = load_examples(path, cache_dir=cache, extra_fields=("level",))
    assert report.format == "math"
    assert [e["answer"] for e in examples] == ["\\frac{3}{4}", "4", "4"]
    assert [e["id"] for e in examples] == [r["unique_id"] for r in MATH_ROWS]
    assert examples[0]["solution"] == MATH_ROWS[0]["solution"]
    assert examples[1]["level"] == "Level 2"


def test_parquet_math(tmp_path, cache):
    import datasets

    path = tmp_path / "math.parquet"
    # from_dict, not from_list: from_list takes its columns from the first row only.
    columns = {k: [r.get(k) for r in MATH_ROWS] for k in MATH_ROWS[2]}
    datasets.Dataset.from_dict(columns).to_parquet(str(path))
    examples, report = load_examples(path, format="math", cache_dir=cache)
    assert [e["answer"] for e in examples] == ["\\frac{3}{4}", "4", "4"]
    assert report.rows == 3


def test_save_to_disk_folder_and_splits(tmp_path):
    import datasets

    dd = datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_list(GSM8K_ROWS),
            "test": datasets.Dataset.from_list(GSM8K_ROWS[:1]),
        }
    )
    folder = tmp_path / "gsm8k_disk"
    dd.save_to_disk(str(folder))
    test, _ = load_examples(folder, split="test")
    assert [e["answer"] for e in test] == ["72"]
    with pytest.raises(ValueError, match="splits"):
        load_examples(folder)
    single = tmp_path / "single"
    datasets.Dataset.from_list(GSM8K_ROWS).save_to_disk(str(single))
    train, _ = load_examples(single)
    assert [e["answer"] for e in train] == ["72", "18000"]


def test_generic_mapping(tmp_path, cache):
    rows = [
        {"instruction": "Add 2 and 3.", "target": 5, "uid": "a"},
        {"instruction": "Halve 9.", "target": "4.5", "uid": "b"},
    ]
    path = _write_jsonl(tmp_path / "generic.jsonl", rows)
    examples, _ = load_examples(
        path,
        format="generic",
        question_field="instruction",
        answer_field="target",
        id_field="uid",
        cache_dir=cache,
    )
    assert [(e["id"], e["question"], e["answer"]) for e in examples] == [
        ("a", "Add 2 and 3.", "5"),
        ("b", "Halve 9.", "4.5"),
    ]


def test_generic_chat_messages(tmp_path, cache):
    rows = [
        {
            "prompt": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "What is 2+2?"},
            ],
            "answer": "4",
        }
    ]
    path = _write_jsonl(tmp_path / "chat.jsonl", rows)
    (ex,), _ = load_examples(path, cache_dir=cache)
    assert ex["question"] == "What is 2+2?" and ex["messages"][0]["role"] == "system"


MALFORMED = [
    {"question": "ok?", "answer": "x\n#### 1"},
    {"question": "missing answer"},
    {"question": "empty", "answer": "reasoning\n####   "},
    {"question": ["not", "a", "string"], "answer": "x\n#### 3"},
    {"question": "fine", "answer": "y\n#### 4"},
]


def test_malformed_rows_error_names_file_and_row(tmp_path, cache):
    path = _write_jsonl(tmp_path / "bad.jsonl", MALFORMED)
    with pytest.raises(MalformedRowError) as err:
        load_examples(path, format="gsm8k", cache_dir=cache)
    msg = str(err.value)
    assert "bad.jsonl" in msg and "row 1" in msg and "answer" in msg


def test_malformed_rows_skip_counts(tmp_path, cache):
    path = _write_jsonl(tmp_path / "bad.jsonl", MALFORMED)
    examples, report = load_examples(path, format="gsm8k", on_malformed="skip", cache_dir=cache)
    assert [e["answer"] for e in examples] == ["1", "4"]
    assert report.num_skipped == 3 and [i for i, _ in report.skipped] == [1, 2, 3]
    assert "list" in report.skipped[2][1]
    assert "3 malformed rows skipped" in report.summary()


def test_math_without_answer_is_malformed(tmp_path, cache):
    rows = [MATH_ROWS[0], {"problem": "p", "solution": "no box here"}]
    path = _write_jsonl(tmp_path / "m.jsonl", rows)
    with pytest.raises(MalformedRowError, match=r"m.jsonl: row 1 \(counting from 0\): .*boxed"):
        load_examples(path, cache_dir=cache)


def test_bad_arguments(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_examples(tmp_path / "nope.jsonl")
    (tmp_path / "x.txt").write_text("hi")
    with pytest.raises(ValueError, match="unsupported"):
        load_examples(tmp_path / "x.txt")
    path = _write_jsonl(tmp_path / "g.jsonl", GSM8K_ROWS)
    with pytest.raises(ValueError, match="on_malformed"):
        load_examples(path, on_malformed="ignore")
    with pytest.raises(ValueError, match="format"):
        load_examples(path, format="csv")


def test_load_task_files_and_heldout_fraction(tmp_path):
    rows = [{"question": f"What is {i} + 1?", "answer": f"x\n#### {i + 1}"} for i in range(20)]
    path = _write_jsonl(tmp_path / "t.jsonl", rows)
    task = load_task({"train_path": str(path), "eval_fraction": 0.25, "seed": 5})
    assert len(task.train) == 15 and len(task.eval) == 5
    assert not {e["id"] for e in task.train} & {e["id"] for e in task.eval}
    again = load_task({"train_path": str(path), "eval_fraction": 0.25, "seed": 5})
    assert [e["id"] for e in again.eval] == [e["id"] for e in task.eval]
    assert task.prompt_format == "chat" and task.reward == "math"
    # The same file as held-out: the 3 held-out prompts leave train (test_heldout_duplicates_*).
    separate = load_task({"train_path": str(path), "eval_path": str(path), "max_eval": 3})
    assert len(separate.train) == 17 and len(separate.eval) == 3
    assert separate.duplicates_removed == 3 and task.duplicates_removed == 0


def test_rewritten_file_with_its_old_mtime_reads_the_new_rows(tmp_path, cache):
    """`cp -p`, `rsync -a` and `tar x` keep a file's modification time: HF datasets' cache (path +
    mtime) would hand back the old rows; the content-keyed cache reads the new ones."""
    import os

    path = _write_jsonl(
        tmp_path / "t.jsonl", [{"question": f"old {i}", "answer": "1"} for i in range(3)]
    )
    before = os.stat(path)
    old, _ = load_examples(path, cache_dir=cache)
    assert [e["question"] for e in old] == ["old 0", "old 1", "old 2"]
    _write_jsonl(path, [{"question": f"new {i}", "answer": "2"} for i in range(3)])
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert os.stat(path).st_mtime_ns == before.st_mtime_ns
    new, _ = load_examples(path, cache_dir=cache)
    assert [e["question"] for e in new] == ["new 0", "new 1", "new 2"]
    assert [e["answer"] for e in new] == ["2", "2", "2"]


def test_folder_not_written_by_save_to_disk_is_one_clear_error(tmp_path):
    folder = tmp_path / "rows"
    folder.mkdir()
    _write_jsonl(folder / "part-0.jsonl", GSM8K_ROWS)
    with pytest.raises(MalformedRowError) as err:
        load_examples(folder)
    msg = str(err.value)
    assert str(folder) in msg and "save_to_disk" in msg and ".jsonl" in msg
    assert "\n" not in msg


def test_invalid_json_line_is_skipped_and_counted(tmp_path, cache):
    lines = [json.dumps({"question": f"q{i}", "answer": str(i)}) for i in range(4)]
    lines.insert(2, '{"question": "cut short", ')
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(MalformedRowError, match=r"line 3 is not valid JSON.*on_malformed=skip"):
        load_examples(path, cache_dir=cache)
    examples, report = load_examples(path, on_malformed="skip", cache_dir=cache)
    assert [e["question"] for e in examples] == ["q0", "q1", "q2", "q3"]
    assert report.rows == 5 and report.kept == 4 and report.num_skipped == 1
    assert report.skipped[0][0] == 2 and "line 3 is not valid JSON" in report.skipped[0][1]
    # Later rows keep their file positions: the ids of rows 3 and 4 (counting from 0).
    assert [e["id"] for e in examples] == ["t-0", "t-1", "t-3", "t-4"]


def test_heldout_duplicates_leave_train_with_a_count_and_a_warning(tmp_path, caplog):
    """A training file sharing prompts with the held-out file (or with itself, split by
    eval_fraction) must not test on prompts it trained on: those training rows are dropped,
    counted in `Task.duplicates_removed` and named in one warning line."""
    from essa_jax.data import prompt_key

    rows = [{"question": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(10)]
    train = _write_jsonl(tmp_path / "train.jsonl", rows)
    # Held-out: rows 2 and 5 again (one with other spacing and case), and two new prompts.
    held = [
        rows[2],
        {"question": "  what IS 5 +  1? ", "answer": "6"},
        {"question": "What is 40 + 1?", "answer": "41"},
        {"question": "What is 1 + 40?", "answer": "41"},  # swapped operands: another prompt
    ]
    heldout = _write_jsonl(tmp_path / "held.jsonl", held)
    with caplog.at_level("WARNING", logger="essa_jax.data.tasks"):
        task = load_task({"train_path": str(train), "eval_path": str(heldout)})
    assert task.duplicates_removed == 2 and len(task.train) == 8 and len(task.eval) == 4
    assert not {prompt_key(e) for e in task.train} & {prompt_key(e) for e in task.eval}
    assert [
        e["question"] for e in task.train if "2 +" in e["question"] or "5 +" in e["question"]
    ] == []
    (line,) = [r.getMessage() for r in caplog.records if "removed" in r.getMessage()]
    assert "removed 2 training examples" in line and "8 training examples remain" in line
    # max_train counts kept examples: the next training rows take the removed ones' places, and
    # only the duplicates met before the limit count.
    capped = load_task({"train_path": str(train), "eval_path": str(heldout), "max_train": 4})
    assert [e["question"] for e in capped.train] == [f"What is {i} + 1?" for i in (0, 1, 3, 4)]
    assert capped.duplicates_removed == 1
    # Duplicate rows inside one file split by eval_fraction: no copy stays on both sides.
    dup = _write_jsonl(tmp_path / "dup.jsonl", rows + rows)
    split = load_task({"train_path": str(dup), "eval_fraction": 0.3, "seed": 0})
    assert not {prompt_key(e) for e in split.train} & {prompt_key(e) for e in split.eval}
    assert split.duplicates_removed > 0
    assert len(split.train) + len(split.eval) + split.duplicates_removed == 20
    # Every training prompt a held-out one: one clear error, not an empty training set.
    with pytest.raises(MalformedRowError, match="no training example is left"):
        load_task({"train_path": str(train), "eval_path": str(train)})


@pytest.mark.parametrize(
    "name", ["add_2d", "mul_1d", "arith_mixed", "word_problems", "instructions"]
)
def test_generated_tasks_share_no_prompt_and_stay_unchanged(name):
    """The generators' splits share no prompt: the duplicate check removes nothing, so their
    training sets are the ones earlier runs trained on."""
    from essa_jax.data import generate_task

    task = load_task({"name": name, "num_train": 64, "num_eval": 16, "seed": 0})
    train, _ = generate_task(name, num_train=64, num_eval=16, seed=0)
    assert task.duplicates_removed == 0
    assert [e["question"] for e in task.train] == [e["question"] for e in train]
