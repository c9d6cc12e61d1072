"""A generated instruction-following task in the IFEval format (`instructions[_l1|_l2]`).

Each prompt asks for a short text about a topic under one (level 1) or two (level 2; no level:
either) verifiable instructions of IFEval types a 135M model can sometimes satisfy (Zhou et al.
2023, arXiv 2311.07911, Table 1): word and sentence limits, all lowercase, keywords to include or
avoid, an exact number of bullets, JSON, a title, a postscript, an ending phrase, no commas,
double quotes. All capitals is left out: the reference's check also asks langdetect for English,
which calls some all-capital English texts of this task German (a reward that would be noise).

The instruction texts are IFEval's own phrasings, and the rows carry IFEval's fields (`key`,
`prompt`, `instruction_id_list`, `kwargs`), so the IFEval rewards (`essa_jax.rewards.ifeval`) score
them exactly as lm-eval's `ifeval` task would.

Every example also carries `answer`: a reference response built together with the prompt that
follows all of its instructions (tests/data/test_instructions.py scores each against the IFEval
reference), the SFT target. Instructions are drawn only in compatible combinations (`_EXCLUDES`),
and the numeric limits (words, sentences) are set from the reference response, so it always
satisfies them.

Deterministic per seed; train and held-out prompts are disjoint (`draw_unique` draws distinct
prompt texts; the held-out set is drawn first).

`instructions_ood[_l1|_l2]`: the held-out set shares nothing with training but the format.
Its instruction types (`OOD_TYPES`: title, end phrase, no commas, sentence count), topics
(`OOD_TOPICS`, 6 of 24) and request verbs (`OOD_VERBS`) never occur in a training (or
validation, carved from the training stream) prompt, so a held-out score measures instruction
following that transfers, not a template learned (issue #41: the in-template held-out set of
`instructions` cannot tell the two apart).
"""

from __future__ import annotations

import itertools
import math
import re
from typing import Any

import numpy as np

# topic -> (title, keywords that occur in its sentences, four comma-free sentences)
TOPICS: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = {
    "the ocean": (
        "The Deep Blue",
        ("water", "waves", "fish", "salt"),
        (
            "The ocean covers most of our planet.",
            "Its water is full of salt.",
            "Many fish live deep below the waves.",
            "People travel across it on ships.",
        ),
    ),
    "the moon": (
        "Our Night Light",
        ("sky", "light", "night", "earth"),
        (
            "The moon moves around the earth.",
            "It reflects light from the sun.",
            "We see it best in the night sky.",
            "Its shape seems to change each week.",
        ),
    ),
    "coffee": (
        "A Warm Cup",
        ("beans", "morning", "cup", "taste"),
        (
            "Coffee is made from roasted beans.",
            "Many people drink a cup every morning.",
            "It has a bitter taste.",
            "It helps people feel awake.",
        ),
    ),
    "dogs": (
        "Loyal Friends",
        ("pets", "walk", "friends", "play"),
        (
            "Dogs are popular pets.",
            "They are loyal friends to people.",
            "Most dogs love to play outside.",
            "They need a walk every day.",
        ),
    ),
    "rain": (
        "Drops From Above",
        ("clouds", "water", "plants", "umbrella"),
        (
            "Rain falls from dark clouds.",
            "It gives water to plants and rivers.",
            "People carry an umbrella to stay dry.",
            "The air smells fresh after it stops.",
        ),
    ),
    "trees": (
        "Green Giants",
        ("leaves", "roots", "shade", "air"),
        (
            "Trees give us shade on hot days.",
            "Their roots hold the soil in place.",
            "Their leaves clean the air we breathe.",
            "They grow tall over many years.",
        ),
    ),
    "bicycles": (
        "Two Wheels",
        ("wheels", "ride", "city", "exercise"),
        (
            "A bicycle has two wheels.",
            "People ride it to work or school.",
            "It is good exercise for the body.",
            "Bikes make little noise in the city.",
        ),
    ),
    "music": (
        "Songs We Share",
        ("songs", "sound", "dance", "feel"),
        (
            "Music is made of sound and rhythm.",
            "People sing songs to share feelings.",
            "It can make us dance or feel calm.",
            "Every culture has its own music.",
        ),
    ),
    "bread": (
        "Fresh From the Oven",
        ("flour", "oven", "bake", "warm"),
        (
            "Bread is made from flour and water.",
            "Bakers bake it in a hot oven.",
            "Fresh bread smells warm and sweet.",
            "It is eaten all over the world.",
        ),
    ),
    "the sun": (
        "Our Star",
        ("star", "heat", "light", "day"),
        (
            "The sun is the star at the center of our system.",
            "It gives us heat and light.",
            "Plants use its light to grow.",
            "Each day begins when it rises.",
        ),
    ),
    "snow": (
        "Winter White",
        ("winter", "cold", "white", "flake"),
        (
            "Snow falls in cold winter weather.",
            "Each flake has six sides.",
            "It covers the ground in white.",
            "Children like to build with it.",
        ),
    ),
    "bees": (
        "Busy Workers",
        ("flower", "honey", "hive", "wings"),
        (
            "Bees fly from flower to flower.",
            "They make honey in their hive.",
            "Their wings beat very fast.",
            "They help plants make seeds.",
        ),
    ),
    "trains": (
        "On the Rails",
        ("rails", "station", "travel", "fast"),
        (
            "Trains run on steel rails.",
            "They carry people from station to station.",
            "Some trains travel very fast.",
            "They can pull many heavy cars.",
        ),
    ),
    "gardens": (
        "A Small Garden",
        ("flowers", "soil", "seeds", "sun"),
        (
            "A garden needs good soil.",
            "Gardeners plant seeds in spring.",
            "Flowers grow well in the sun.",
            "Weeds must be pulled often.",
        ),
    ),
    "books": (
        "Pages and Stories",
        ("pages", "stories", "read", "library"),
        (
            "Books hold stories on their pages.",
            "People read them to learn and relax.",
            "A library lends books for free.",
            "Some books are read by millions.",
        ),
    ),
    "mountains": (
        "High Peaks",
        ("peaks", "snow", "climb", "rock"),
        (
            "Mountains rise high above the land.",
            "Their peaks are often covered in snow.",
            "People climb them for adventure.",
            "They are made of hard rock.",
        ),
    ),
    "cats": (
        "Quiet Hunters",
        ("pets", "sleep", "hunt", "paws"),
        (
            "Cats are calm and clever pets.",
            "They sleep for much of the day.",
            "They hunt with soft paws and sharp eyes.",
            "Many cats like to sit in the sun.",
        ),
    ),
    "tea": (
        "A Calm Drink",
        ("leaves", "hot", "cup", "drink"),
        (
            "Tea is made from dried leaves.",
            "People drink it hot or cold.",
            "A cup of tea can feel calming.",
            "It is popular in many countries.",
        ),
    ),
    "rivers": (
        "Flowing Water",
        ("water", "sea", "fish", "banks"),
        (
            "Rivers carry water to the sea.",
            "Fish swim in their currents.",
            "Towns often grow along their banks.",
            "Some rivers are very long.",
        ),
    ),
    "the wind": (
        "Moving Air",
        ("air", "trees", "storm", "blow"),
        (
            "Wind is air that moves.",
            "It can blow leaves off the trees.",
            "A strong storm brings fast wind.",
            "Wind turns the blades of a mill.",
        ),
    ),
    "apples": (
        "A Crisp Fruit",
        ("snack", "trees", "sweet", "red"),
        (
            "Apples grow on trees.",
            "They can be red or green.",
            "Their taste is sweet and crisp.",
            "An apple is a healthy snack.",
        ),
    ),
    "libraries": (
        "Quiet Rooms",
        ("books", "quiet", "read", "learn"),
        (
            "A library is full of books.",
            "People read there in quiet rooms.",
            "It is a good place to learn.",
            "Most libraries are free to use.",
        ),
    ),
    "birds": (
        "Feathered Flight",
        ("wings", "nests", "sing", "fly"),
        (
            "Birds have wings and feathers.",
            "Most birds can fly.",
            "They build nests for their eggs.",
            "Many birds sing in the morning.",
        ),
    ),
    "the desert": (
        "Sand and Sun",
        ("rain", "hot", "dry", "water"),
        (
            "A desert is a dry place.",
            "It gets very little rain.",
            "The days are hot and the nights are cold.",
            "Plants there store water.",
        ),
    ),
}
VERBS = (
    "Write a short paragraph about",
    "Describe",
    "Tell me about",
    "Write a few sentences about",
)
# instructions_ood: what only its held-out prompts use (never a training prompt).
OOD_TYPES = ("title", "end", "no_comma", "sentences")
OOD_TOPICS = ("tea", "rivers", "apples", "libraries", "birds", "the desert")
OOD_VERBS = (
    "Give a brief account of",
    "Share a few facts about",
    "Compose a short note on",
    "Say something about",
)
# Words no topic's reference text uses (`keywords:forbidden_words`; checked at import below).
FORBIDDEN = ("money", "computer", "war", "phone", "car", "king", "doctor", "game")
END_PHRASES = (
    "Is there anything else I can help with?",
    "Any other questions?",
    "Let me know if you have additional questions.",
)
POSTSCRIPT = "P.S. Thank you for reading."
WORD_SLACK = 8  # a word limit is the reference's count +- 1..WORD_SLACK
SENTENCE_SLACK = 2

# IFEval instruction ids used here (short name -> id).
IDS = {
    "lowercase": "change_case:english_lowercase",
    "keywords": "keywords:existence",
    "forbidden": "keywords:forbidden_words",
    "bullets": "detectable_format:number_bullet_lists",
    "json": "detectable_format:json_format",
    "title": "detectable_format:title",
    "postscript": "detectable_content:postscript",
    "end": "startend:end_checker",
    "no_comma": "punctuation:no_comma",
    "quotation": "startend:quotation",
    "words": "length_constraints:number_words",
    "sentences": "length_constraints:number_sentences",
}
_STRUCTURE = {"bullets", "json", "title", "postscript", "end", "quotation"}
# Pairs drawn together only when one reference response can satisfy both.
_EXCLUDES = {
    "json": _STRUCTURE,
    "quotation": _STRUCTURE,
    "sentences": _STRUCTURE,  # Punkt's count of a title, bullet or P.S. line is not ours to fix
}
# Distinct kwargs each instruction can draw (for `InstructionSpace.size`).
_VARIANTS = {
    "keywords": math.comb(4, 2),
    "forbidden": len(FORBIDDEN),
    "bullets": 3,
    "end": len(END_PHRASES),
    "words": 2 * WORD_SLACK,
    "sentences": 2 * SENTENCE_SLACK,
}
_WORD_RE = re.compile(r"\w+")  # IFEval counts words with nltk's RegexpTokenizer(r"\w+")


def _compatible(a: str, b: str) -> bool:
    return a != b and b not in _EXCLUDES.get(a, ()) and a not in _EXCLUDES.get(b, ())


def instruction_sets(
    level: int | None, types: tuple[str, ...] | None = None
) -> list[tuple[str, ...]]:
    """Every set of short instruction names a prompt may carry at `level` (1, 2 or None: both),
    drawn from `types` (None: every name in IDS)."""
    names = sorted(types if types is not None else IDS)
    one = [(n,) for n in names]
    two = [(a, b) for a, b in itertools.combinations(names, 2) if _compatible(a, b)]
    return {1: one, 2: two, None: one + two}[level]


def _text(name: str, kw: dict[str, Any]) -> str:
    """IFEval's description of an instruction (lm_eval/tasks/ifeval/instructions.py wording)."""
    if name == "lowercase":
        return (
            "Your entire response should be in English, and in all lowercase letters. "
            "No capital letters are allowed."
        )
    if name == "keywords":
        return f"Include keywords {', '.join(kw['keywords'])} in the response."
    if name == "forbidden":
        return f"Do not include keywords {', '.join(kw['forbidden_words'])} in the response."
    if name == "bullets":
        return (
            f"Your answer must contain exactly {kw['num_bullets']} bullet points. Use the "
            "markdown bullet points such as:\n* This is point 1. \n* This is point 2"
        )
    if name == "json":
        return (
            "Entire output should be wrapped in JSON format. You can use markdown ticks "
            "such as ```."
        )
    if name == "title":
        return (
            "Your answer must contain a title, wrapped in double angular brackets, such as "
            "<<poem of joy>>."
        )
    if name == "postscript":
        return (
            "At the end of your response, please explicitly add a postscript starting with "
            f"{kw['postscript_marker']}"
        )
    if name == "end":
        return (
            f"Finish your response with this exact phrase {kw['end_phrase']}. No other words "
            "should follow this phrase."
        )
    if name == "no_comma":
        return "In your entire response, refrain from the use of any commas."
    if name == "quotation":
        return "Wrap your entire response with double quotation marks."
    if name == "words":
        return f"Answer with {kw['relation']} {kw['num_words']} words."
    if name == "sentences":
        return f"Your response should contain {kw['relation']} {kw['num_sentences']} sentences."
    raise ValueError(f"unknown instruction {name!r}; valid: {sorted(IDS)}")


def _limit(rng: np.random.Generator, count: int, slack: int) -> tuple[str, int]:
    """A (relation, bound) the count satisfies: "less than" count + d or "at least" count - d."""
    d = int(rng.integers(1, slack + 1))
    if count - d >= 1 and rng.integers(2):
        return "at least", count - d
    return "less than", count + d


def make_example(
    rng: np.random.Generator,
    names: tuple[str, ...],
    topics: tuple[str, ...] | None = None,
    verbs: tuple[str, ...] = VERBS,
) -> dict[str, Any]:
    """One prompt with instructions `names` about one of `topics` (None: every topic) asked with
    one of `verbs`, its IFEval fields and a reference response."""
    pool = list(topics if topics is not None else TOPICS)
    topic = pool[int(rng.integers(len(pool)))]
    title, keywords, sentences = TOPICS[topic]
    verb = verbs[int(rng.integers(len(verbs)))]
    kw: dict[str, dict[str, Any]] = {n: {} for n in names}
    body = list(sentences)
    if "bullets" in names:
        k = int(rng.integers(2, 5))
        kw["bullets"] = {"num_bullets": k}
        text = "\n".join(f"* {s}" for s in body[:k])
    elif "json" in names:
        text = '{"answer": "' + " ".join(body) + '"}'
    else:
        text = " ".join(body)
    if "keywords" in names:
        # Two of the topic's keywords that the reference uses (bullets keep only k sentences;
        # each topic's first two sentences hold two keywords).
        present = [k for k in keywords if re.search(k, text, re.IGNORECASE)]
        pick = sorted(int(i) for i in rng.choice(len(present), size=2, replace=False))
        kw["keywords"] = {"keywords": [present[i] for i in pick]}
    if "forbidden" in names:
        kw["forbidden"] = {"forbidden_words": [FORBIDDEN[int(rng.integers(len(FORBIDDEN)))]]}
    if "title" in names:
        text = f"<<{title}>>\n{text}"
    if "postscript" in names:
        kw["postscript"] = {"postscript_marker": "P.S."}
        text = f"{text}\n{POSTSCRIPT}"
    if "end" in names:
        kw["end"] = {"end_phrase": END_PHRASES[int(rng.integers(len(END_PHRASES)))]}
        text = f"{text}\n{kw['end']['end_phrase']}"
    if "quotation" in names:
        text = f'"{text}"'
    if "lowercase" in names:
        text = text.lower()
    if "words" in names:
        rel, n = _limit(rng, len(_WORD_RE.findall(text)), WORD_SLACK)
        kw["words"] = {"relation": rel, "num_words": n}
    if "sentences" in names:
        rel, n = _limit(rng, len(body), SENTENCE_SLACK)
        kw["sentences"] = {"relation": rel, "num_sentences": n}
    prompt = f"{verb} {topic}. " + " ".join(_text(n, kw[n]) for n in names)
    return {
        "question": prompt,
        "prompt": prompt,
        "answer": text,
        "instruction_id_list": [IDS[n] for n in names],
        "kwargs": [kw[n] for n in names],
        "topic": topic,
    }


class InstructionSpace:
    """Prompts of one level for `draw_unique`: a distinct prompt text is a distinct problem.
    `types`, `topics`, `verbs` restrict what a prompt may use (None: everything)."""

    def __init__(
        self,
        task: str,
        level: int | None,
        types: tuple[str, ...] | None = None,
        topics: tuple[str, ...] | None = None,
        verbs: tuple[str, ...] = VERBS,
    ):
        if level not in (1, 2, None):
            raise ValueError(f"instructions level {level} is not valid; valid: [1, 2]")
        self.task = task
        self.sets = instruction_sets(level, types)
        self.topics = tuple(topics if topics is not None else TOPICS)
        self.verbs = tuple(verbs)
        per_topic = sum(math.prod(_VARIANTS.get(n, 1) for n in s) for s in self.sets)
        # An upper bound on distinct prompts: topics x verbs x kwargs variants of every set.
        self.size = len(self.topics) * len(self.verbs) * per_topic

    def sample(self, rng: np.random.Generator) -> tuple[str, dict[str, Any]]:
        names = self.sets[int(rng.integers(len(self.sets)))]
        ex = make_example(rng, names, self.topics, self.verbs)
        ex["task"] = self.task
        return ex["prompt"], ex


def ood_spaces(name: str, level: int | None) -> tuple[InstructionSpace, InstructionSpace]:
    """(train space, held-out space) of `instructions_ood`: disjoint instruction types, topics and
    verbs (module docstring)."""
    train_types = tuple(n for n in IDS if n not in OOD_TYPES)
    train_topics = tuple(t for t in TOPICS if t not in OOD_TOPICS)
    return (
        InstructionSpace(name, level, train_types, train_topics, VERBS),
        InstructionSpace(name, level, OOD_TYPES, OOD_TOPICS, OOD_VERBS),
    )


def generate_instructions(
    name: str, *, num_train: int, num_eval: int, seed: int, level: int | None, ood: bool = False
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(train, eval) of `instructions[_l<level>]`, or with `ood` of `instructions_ood[_l<level>]`
    (eval from `ood_spaces`' held-out space); ids are `<name>-<split>-<i>` (also `key`)."""
    from .arithmetic import draw_unique

    if num_train < 0 or num_eval < 0:
        raise ValueError(f"num_train and num_eval must be >= 0, got {num_train}, {num_eval}")
    if ood:
        train_space, eval_space = ood_spaces(name, level)
        # Different seeds' streams (the spaces share no prompt, so disjointness holds anyway).
        evals = draw_unique(eval_space, num_eval, seed, name + "/heldout")
        train = draw_unique(train_space, num_train, seed, name)
    else:
        rows = draw_unique(InstructionSpace(name, level), num_train + num_eval, seed, name)
        evals, train = rows[:num_eval], rows[num_eval:]
    for split, exs in (("eval", evals), ("train", train)):
        for i, ex in enumerate(exs):
            ex["id"] = ex["key"] = f"{name}-{split}-{i}"
    return train, evals
