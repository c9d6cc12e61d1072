"""Responses covering every IFEval instruction type, with verdicts worked out by hand.

Each case: (instruction id, kwargs, response, strict, loose). `strict` / `loose` are what the IFEval
rules (arXiv 2311.07911, Sec. 3) say, read off the instruction's definition; loose differs from
strict when a first / last line or `*` markdown hides a followed instruction. The test checks the
rewards against these and against lm-eval's `process_results`.
"""

PROMPT = "Write a short note about the sea. Repeat the request first."

CASES = [
    # keywords
    ("keywords:existence", {"keywords": ["sea", "salt"]}, "The sea is full of salt.", 1, 1),
    ("keywords:existence", {"keywords": ["sea", "salt"]}, "The sea is wide.", 0, 0),
    (
        "keywords:frequency",
        {"keyword": "wave", "frequency": 2, "relation": "at least"},
        "A wave and a wave.",
        1,
        1,
    ),
    (
        "keywords:frequency",
        {"keyword": "wave", "frequency": 2, "relation": "less than"},
        "A wave and a wave.",
        0,
        0,
    ),
    ("keywords:forbidden_words", {"forbidden_words": ["boat"]}, "Ships sail here.", 1, 1),
    ("keywords:forbidden_words", {"forbidden_words": ["boat"]}, "A boat sails.", 0, 0),
    (
        "keywords:letter_frequency",
        {"letter": "z", "let_frequency": 2, "let_relation": "at least"},
        "Zebras zigzag.",
        1,
        1,
    ),
    (
        "keywords:letter_frequency",
        {"letter": "z", "let_frequency": 2, "let_relation": "less than"},
        "Zebras zigzag.",
        0,
        0,
    ),
    # language
    (
        "language:response_language",
        {"language": "en"},
        "The sea is calm today and the sky is clear over the water.",
        1,
        1,
    ),
    (
        "language:response_language",
        {"language": "en"},
        "La mer est calme aujourd'hui et le ciel est clair au-dessus de l'eau.",
        0,
        0,
    ),
    # length
    (
        "length_constraints:number_sentences",
        {"num_sentences": 3, "relation": "less than"},
        "The sea is blue. It is deep.",
        1,
        1,
    ),
    (
        "length_constraints:number_sentences",
        {"num_sentences": 3, "relation": "at least"},
        "The sea is blue. It is deep.",
        0,
        0,
    ),
    (
        "length_constraints:number_sentences",
        {"num_sentences": 2, "relation": "less than"},
        "Here you go.\nThe sea is blue.",
        0,
        1,
    ),
    (
        "length_constraints:number_paragraphs",
        {"num_paragraphs": 2},
        "The sea is blue.\n***\nIt is deep.",
        1,
        1,
    ),
    ("length_constraints:number_paragraphs", {"num_paragraphs": 2}, "The sea is blue.", 0, 0),
    (
        "length_constraints:number_words",
        {"num_words": 5, "relation": "less than"},
        "Blue deep sea.",
        1,
        1,
    ),
    (
        "length_constraints:number_words",
        {"num_words": 5, "relation": "at least"},
        "Blue deep sea.",
        0,
        0,
    ),
    (
        "length_constraints:number_words",
        {"num_words": 5, "relation": "less than"},
        "Sure, here is my short answer:\nBlue deep sea.",
        0,
        1,
    ),
    (
        "length_constraints:nth_paragraph_first_word",
        {"num_paragraphs": 2, "nth_paragraph": 2, "first_word": "waves"},
        "The sea is blue.\n\nWaves are tall.",
        1,
        1,
    ),
    (
        "length_constraints:nth_paragraph_first_word",
        {"num_paragraphs": 2, "nth_paragraph": 2, "first_word": "waves"},
        "The sea is blue.\n\nTides are tall.",
        0,
        0,
    ),
    # detectable content
    (
        "detectable_content:number_placeholders",
        {"num_placeholders": 2},
        "Meet at [place] on [date].",
        1,
        1,
    ),
    ("detectable_content:number_placeholders", {"num_placeholders": 2}, "Meet at [place].", 0, 0),
    (
        "detectable_content:postscript",
        {"postscript_marker": "P.S."},
        "The sea is blue.\nP.S. Bring a towel.",
        1,
        1,
    ),
    ("detectable_content:postscript", {"postscript_marker": "P.S."}, "The sea is blue.", 0, 0),
    # detectable format
    ("detectable_format:number_bullet_lists", {"num_bullets": 2}, "* salt\n* sand", 1, 1),
    ("detectable_format:number_bullet_lists", {"num_bullets": 2}, "* salt\n* sand\n* sun", 0, 1),
    ("detectable_format:number_bullet_lists", {"num_bullets": 2}, "* salt", 0, 0),
    (
        "detectable_format:number_bullet_lists",
        {"num_bullets": 2},
        "* salt\n* sand\n- that is all",
        0,
        1,
    ),
    ("detectable_format:constrained_response", {}, "My answer is yes.", 1, 1),
    ("detectable_format:constrained_response", {}, "Yes.", 0, 0),
    (
        "detectable_format:number_highlighted_sections",
        {"num_highlights": 2},
        "*salt* and *sand*",
        1,
        1,
    ),
    ("detectable_format:number_highlighted_sections", {"num_highlights": 2}, "*salt* only", 0, 0),
    (
        "detectable_format:multiple_sections",
        {"section_spliter": "Section", "num_sections": 2},
        "Section 1\nSalt.\nSection 2\nSand.",
        1,
        1,
    ),
    (
        "detectable_format:multiple_sections",
        {"section_spliter": "Section", "num_sections": 2},
        "Section 1\nSalt.",
        0,
        0,
    ),
    ("detectable_format:json_format", {}, '{"sea": "blue"}', 1, 1),
    ("detectable_format:json_format", {}, '```json\n{"sea": "blue"}\n```', 1, 1),
    ("detectable_format:json_format", {}, 'Here it is:\n{"sea": "blue"}', 0, 1),
    ("detectable_format:json_format", {}, "sea: blue", 0, 0),
    ("detectable_format:title", {}, "<<The Sea>>\nIt is blue.", 1, 1),
    ("detectable_format:title", {}, "The Sea\nIt is blue.", 0, 0),
    # combination
    ("combination:two_responses", {}, "The sea is blue.\n******\nThe sea is deep.", 1, 1),
    ("combination:two_responses", {}, "The sea is blue.\n******\nThe sea is blue.", 0, 0),
    (
        "combination:repeat_prompt",
        {"prompt_to_repeat": "Write a short note about the sea."},
        "Write a short note about the sea. It is blue.",
        1,
        1,
    ),
    (
        "combination:repeat_prompt",
        {"prompt_to_repeat": "Write a short note about the sea."},
        "It is blue.",
        0,
        0,
    ),
    # start / end
    (
        "startend:end_checker",
        {"end_phrase": "Any other questions?"},
        "The sea is blue. Any other questions?",
        1,
        1,
    ),
    (
        "startend:end_checker",
        {"end_phrase": "Any other questions?"},
        "Any other questions? The sea is blue.",
        0,
        0,
    ),
    (
        "startend:end_checker",
        {"end_phrase": "Any other questions?"},
        "The sea is blue. Any other questions?\nGoodbye.",
        0,
        1,
    ),
    ("startend:quotation", {}, '"The sea is blue."', 1, 1),
    ("startend:quotation", {}, "The sea is blue.", 0, 0),
    # change case
    (
        "change_case:capital_word_frequency",
        {"capital_frequency": 2, "capital_relation": "at least"},
        "The SEA is VERY blue.",
        1,
        1,
    ),
    (
        "change_case:capital_word_frequency",
        {"capital_frequency": 2, "capital_relation": "less than"},
        "The SEA is VERY blue.",
        0,
        0,
    ),
    ("change_case:english_capital", {}, "THE SEA IS BLUE.", 1, 1),
    ("change_case:english_capital", {}, "THE SEA IS Blue.", 0, 0),
    ("change_case:english_lowercase", {}, "the sea is blue.", 1, 1),
    ("change_case:english_lowercase", {}, "The sea is blue.", 0, 0),
    ("change_case:english_lowercase", {}, "Sure! Here:\nthe sea is blue.", 0, 1),
    # punctuation
    ("punctuation:no_comma", {}, "The sea is blue and deep.", 1, 1),
    ("punctuation:no_comma", {}, "The sea is blue, and deep.", 0, 0),
]
