"""The Chinese-arithmetic translation task: numerals right (hand-checked tables, and read back by
parsers written here), every answer right, deterministic, splits disjoint."""

import random
import re

import pytest

from zoo.data.synthetic import translation as st

# Hand-checked against the rules of written Chinese numerals.
CHINESE = {
    0: "零", 1: "一", 2: "二", 10: "十", 11: "十一", 19: "十九", 20: "二十", 23: "二十三",
    99: "九十九", 100: "一百", 101: "一百零一", 105: "一百零五", 110: "一百一十",
    115: "一百一十五", 200: "二百", 320: "三百二十", 999: "九百九十九", 1000: "一千",
    1001: "一千零一", 1010: "一千零一十", 1100: "一千一百", 1234: "一千二百三十四",
    2019: "二千零一十九", 9999: "九千九百九十九", 10000: "一万", 10001: "一万零一",
    10010: "一万零一十", 10100: "一万零一百", 11000: "一万一千", 100000: "十万",
    100010: "十万零一十", 110000: "十一万", 1000000: "一百万", 10001000: "一千万一千",
    10000100: "一千万零一百", 99999999: "九千九百九十九万九千九百九十九", 100000000: "一亿",
    100000001: "一亿零一", 100010000: "一亿零一万", 120000000: "一亿二千万",
    1000000000: "十亿", 999999999999: "九千九百九十九亿九千九百九十九万九千九百九十九",
}
LIANG = {2: "二", 12: "十二", 20: "二十", 200: "两百", 2019: "两千零一十九",
         2222: "两千两百二十二", 20000: "两万", 22000: "两万两千", 220000: "二十二万", 200000002: "两亿零二"}
ENGLISH = {
    0: "zero", 1: "one", 10: "ten", 11: "eleven", 19: "nineteen", 20: "twenty",
    23: "twenty-three", 99: "ninety-nine", 100: "one hundred", 101: "one hundred one",
    105: "one hundred five", 110: "one hundred ten", 999: "nine hundred ninety-nine",
    1000: "one thousand", 1001: "one thousand one", 1010: "one thousand ten",
    1100: "one thousand one hundred", 2019: "two thousand nineteen",
    9999: "nine thousand nine hundred ninety-nine", 10000: "ten thousand",
    100000: "one hundred thousand", 1000000: "one million", 1002003: "one million two thousand three",
    -22: "negative twenty-two", 10**18 - 1: "nine hundred ninety-nine quadrillion nine hundred "
    "ninety-nine trillion nine hundred ninety-nine billion nine hundred ninety-nine million nine "
    "hundred ninety-nine thousand nine hundred ninety-nine",
}

# --- independent readers ---------------------------------------------------------------------
_ZH_DIGITS = {c: i for i, c in enumerate("零一二三四五六七八九")} | {"两": 2}
_ZH_SMALL = {"十": 10, "百": 100, "千": 1000}
_ZH_LARGE = {"万": 10**4, "亿": 10**8}


def read_chinese(text):
    """The value of a Chinese numeral (lenient: 一百十 reads 110 too; the tests check form)."""
    total = section = number = 0
    for c in text:
        if c in _ZH_DIGITS:
            number = _ZH_DIGITS[c]
        elif c in _ZH_SMALL:
            section += (number or 1) * _ZH_SMALL[c]
            number = 0
        elif c in _ZH_LARGE:
            total += (section + number) * _ZH_LARGE[c]
            section = number = 0
        else:
            raise AssertionError(f"{c!r} in {text!r} is not a numeral character")
    return total + section + number


_EN_UNITS = {w: i for i, w in enumerate(
    ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
     "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen",
     "nineteen"])}
_EN_TENS = {w: 10 * i for i, w in enumerate(
    ["twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"], start=2)}
_EN_SCALES = {"thousand": 10**3, "million": 10**6, "billion": 10**9, "trillion": 10**12,
              "quadrillion": 10**15}
_HYPHENATED = re.compile(rf"^({'|'.join(_EN_TENS)})-({'|'.join(list(_EN_UNITS)[1:10])})$")


def read_english(text):
    """The value of an English number; asserts its form (hyphens only in tens-ones)."""
    words = text.split(" ")
    sign = 1
    if words[0] == "negative":
        sign, words = -1, words[1:]
    total = current = 0
    for word in words:
        if "-" in word:
            assert _HYPHENATED.match(word), word
            tens, ones = word.split("-")
            current += _EN_TENS[tens] + _EN_UNITS[ones]
        elif word in _EN_UNITS:
            current += _EN_UNITS[word]
        elif word in _EN_TENS:
            current += _EN_TENS[word]
        elif word == "hundred":
            current *= 100
        elif word in _EN_SCALES:
            total += current * _EN_SCALES[word]
            current = 0
        else:
            raise AssertionError(f"{word!r} in {text!r} is not a number word")
    return sign * (total + current)


_SOURCE = re.compile(r"^(.+?)(加|减|乘|除以)(.+)$")
_TARGET = re.compile(r"^(.+) (plus|minus|times|divided by) (.+) equals (.+)$")
_ZH_OP = {"加": "+", "减": "-", "乘": "*", "除以": "/"}
_EN_OP = {"plus": "+", "minus": "-", "times": "*", "divided by": "/"}


def check_pair(source, target):
    """(a, op, b) of a pair, after checking both sides say the same problem and the answer."""
    ms, mt = _SOURCE.match(source), _TARGET.match(target)
    assert ms and mt, (source, target)
    a, op, b = read_chinese(ms[1]), _ZH_OP[ms[2]], read_chinese(ms[3])
    assert (read_english(mt[1]), _EN_OP[mt[2]], read_english(mt[3])) == (a, op, b), target
    answer = read_english(mt[4])
    expected = {"+": a + b, "-": a - b, "*": a * b}.get(op)
    if op == "/":
        assert b != 0 and a == b * answer, (source, target)  # exact division
    else:
        assert answer == expected, (source, target)
    # Canonical forms: what the two numeral functions write, nothing else.
    assert ms[1] == st.chinese_numeral(a) and ms[3] == st.chinese_numeral(b)
    assert mt[4] == st.english_number(answer)
    return a, op, b


# --- numerals --------------------------------------------------------------------------------


def test_chinese_numerals_match_the_hand_checked_table():
    assert {n: st.chinese_numeral(n) for n in CHINESE} == CHINESE
    assert {n: st.chinese_numeral(n, liang=True) for n in LIANG} == LIANG


def test_english_numbers_match_the_hand_checked_table():
    assert {n: st.english_number(n) for n in ENGLISH} == ENGLISH


def test_chinese_numerals_read_back_and_follow_the_zero_rules():
    rng = random.Random(0)
    numbers = list(range(100_000)) + [rng.randint(0, st.MAX_CHINESE_NUMERAL) for _ in range(3000)]
    seen = set()
    for n in numbers:
        text = st.chinese_numeral(n)
        assert read_chinese(text) == n, (n, text)
        assert "零零" not in text and not (n and text.endswith("零")), (n, text)
        assert not text.startswith("一十"), (n, text)  # 十一, not 一十一
        seen.add(text)
        assert read_chinese(st.chinese_numeral(n, liang=True)) == n
    assert len(seen) == len(set(numbers))  # one numeral per number


def test_english_numbers_read_back():
    rng = random.Random(0)
    numbers = list(range(-1000, 100_000)) + [rng.randint(-st.MAX_ENGLISH_NUMBER,
                                                         st.MAX_ENGLISH_NUMBER)
                                             for _ in range(3000)]
    for n in numbers:
        text = st.english_number(n)
        assert read_english(text) == n, (n, text)
        assert text == text.lower() and "  " not in text and " and " not in f" {text} "


@pytest.mark.parametrize("fn, bad", [(st.chinese_numeral, -1),
                                     (st.chinese_numeral, st.MAX_CHINESE_NUMERAL + 1),
                                     (st.chinese_numeral, 1.0),
                                     (st.english_number, st.MAX_ENGLISH_NUMBER + 1),
                                     (st.english_number, True)])
def test_numbers_out_of_range_are_errors(fn, bad):
    with pytest.raises(ValueError, match="n="):
        fn(bad)


# --- pairs -----------------------------------------------------------------------------------


def test_the_seed_example():
    assert st.translate_problem(1, "+", 3) == ("一加三", "one plus three equals four")
    pairs = st.translation_pairs(seed=0, num_pairs=16, max_operand=3, operations=("+",))
    assert ("一加三", "one plus three equals four") in pairs


@pytest.fixture(scope="module")
def default_splits():
    return st.translation_splits()


def test_every_default_pair_is_right(default_splits):
    problems = [check_pair(s, t) for split in default_splits.values() for s, t in split]
    assert len(problems) == 20000
    ops = {op for _, op, _ in problems}
    assert ops == {"+", "-"}
    assert max(max(a, b) for a, _, b in problems) == 99
    assert any(a < b for a, op, b in problems if op == "-")  # negative answers are asked for


def test_every_pair_is_right_for_large_operands_and_all_operations():
    pairs = st.translation_pairs(seed=1, num_pairs=3000, max_operand=99_999_999,
                                 operations=("+", "-", "*", "/"))
    problems = [check_pair(s, t) for s, t in pairs]
    assert {op for _, op, _ in problems} == {"+", "-", "*", "/"}
    assert any(a >= 10**7 for a, _, _ in problems)
    assert any("万" in s and "零" in s for s, _ in pairs)


def test_pairs_are_deterministic_and_distinct():
    a = st.translation_pairs(seed=3, num_pairs=500, max_operand=999)
    assert a == st.translation_pairs(seed=3, num_pairs=500, max_operand=999)
    assert a != st.translation_pairs(seed=4, num_pairs=500, max_operand=999)
    assert len({s for s, _ in a}) == 500
    assert a[:100] == st.translation_pairs(seed=3, num_pairs=100, max_operand=999)


def test_every_problem_can_be_drawn_but_no_more():
    # max_operand=3: 16 sums and, with divisors 1..3 and a = b*q <= 3, 4 + 2 + 2 = 8 divisions.
    pairs = st.translation_pairs(seed=0, num_pairs=24, max_operand=3, operations="+/")
    problems = {check_pair(s, t) for s, t in pairs}
    assert problems == ({(a, "+", b) for a in range(4) for b in range(4)}
                        | {(b * q, "/", b) for b in (1, 2, 3) for q in range(3 // b + 1)})
    with pytest.raises(ValueError, match="24 distinct problems"):
        st.translation_pairs(seed=0, num_pairs=25, max_operand=3, operations="+/")


@pytest.mark.parametrize("kwargs, match", [
    ({"operations": ("+", "^")}, "operations"),
    ({"operations": ()}, "operations"),
    ({"operations": ("+", "+")}, "more than once"),
    ({"max_operand": 0}, "max_operand"),
    ({"max_operand": st.MAX_OPERAND + 1}, "max_operand"),
    ({"num_pairs": 0}, "num_pairs"),
])
def test_bad_arguments_are_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        st.translation_pairs(**kwargs)


def test_splits_are_disjoint_and_partition_the_pairs(default_splits):
    assert {k: len(v) for k, v in default_splits.items()} == {
        "train": 16000, "validation": 2000, "test": 2000}
    sources = {k: {s for s, _ in v} for k, v in default_splits.items()}
    assert not sources["train"] & sources["validation"]
    assert not sources["train"] & sources["test"]
    assert not sources["validation"] & sources["test"]
    small = st.translation_splits(seed=5, num_pairs=50, max_operand=20)
    assert small["train"] + small["validation"] + small["test"] == st.translation_pairs(
        seed=5, num_pairs=50, max_operand=20)
    with pytest.raises(ValueError, match="num_pairs"):
        st.translation_splits(num_pairs=4)
