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
    separate = load_task({"train_path": str(path), "eval_path": str(path), "max_eval": 3})
    assert len(separate.train) == 20 and len(separate.eval) == 3
