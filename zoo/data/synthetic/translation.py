"""A seeded, offline translation task: arithmetic in Chinese numerals -> English sentences.

The Transformer course slides' translation example is "一加三" -> "one plus three equals four": the
encoder reads the Chinese, the decoder writes the English. Here every pair is such a problem, and
the English states the answer, so a model must compute it, not just translate word for word::

    一加三            -> one plus three equals four
    二十三减四十五    -> twenty-three minus forty-five equals negative twenty-two
    一百零五乘十二    -> one hundred five times twelve equals one thousand two hundred sixty
    八十四除以七      -> eighty-four divided by seven equals twelve

Operations (`operations`, any of):
  '+' 加 "plus"; '-' 减 "minus" (a < b gives a negative answer, said "negative ..."); '*' 乘
  "times"; '/' 除以 "divided by" (exact: a = b * q, b >= 1, so the answer is a whole number).

Operands are whole numbers in [0, max_operand]. The default, max_operand=99 (numerals of at most
three characters), keeps the task small for a tiny model on a CPU; larger values (999, 9999, ...) bring 百/千/万 and 零 into
the source and make the task harder. Chinese numerals follow `chinese_numeral`'s rules, English
ones `english_number`'s. Sources carry no spaces, as Chinese text does not; targets are lower
case words without final punctuation, like the seed's example.

Tokenizing: Chinese has no spaces, so SentencePiece sees a whole source as one "word", and a
BPE vocabulary much beyond ~120 pieces spends itself on chunks that cross the operator
('减八十四'), making every operand an opaque symbol; one piece per Chinese character (a small
vocabulary, or BPE trained with Han characters pre-split) keeps the numerals compositional.

Everything is keyed off an explicit seed through `random.Random`, so equal arguments give equal
pairs in every process.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from zoo.errors import ConfigError

_DIGITS = "零一二三四五六七八九"
_SMALL_UNITS = ("千", "百", "十", "")  # within a 4-digit group, most significant first
_LARGE_UNITS = ("亿", "万", "")  # of the 4-digit groups, most significant first
MAX_CHINESE_NUMERAL = 10**12 - 1  # 九千九百九十九亿九千九百九十九万九千九百九十九

_ONES = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
         "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen",
         "eighteen", "nineteen")
_TENS = ("", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety")
_SCALES = ("", "thousand", "million", "billion", "trillion", "quadrillion")
MAX_ENGLISH_NUMBER = 10**18 - 1  # 999 quadrillion ... nine hundred ninety-nine

# op -> (Chinese operator, English operator, answer)
OPERATIONS = {
    "+": ("加", "plus", lambda a, b: a + b),
    "-": ("减", "minus", lambda a, b: a - b),
    "*": ("乘", "times", lambda a, b: a * b),
    "/": ("除以", "divided by", lambda a, b: a // b),
}
# Keeps products below MAX_ENGLISH_NUMBER and operands in the 万 range of everyday Chinese.
MAX_OPERAND = 99_999_999
SPLIT_FRACTIONS = (("train", 0.8), ("validation", 0.1), ("test", 0.1))


def _group(g: int, leading: bool, liang: bool) -> str:
    """Chinese for 1 <= g <= 9999, one 4-digit group (before its 万 / 亿, if any)."""
    out = []
    zero_pending = False
    for i, unit in enumerate(_SMALL_UNITS):
        d = g // 10 ** (3 - i) % 10
        if d == 0:
            zero_pending = bool(out)  # zeros between digits read as one 零; trailing ones not at all
            continue
        if zero_pending:
            out.append("零")
            zero_pending = False
        out.append(("两" if liang and d == 2 and unit in ("千", "百") else _DIGITS[d]) + unit)
    text = "".join(out)
    if leading and text.startswith("一十"):
        text = text[1:]  # 十, 十五, 十万: a number never starts with 一十 (but 一百一十 keeps it)
    return text


def chinese_numeral(n: int, *, liang: bool = False) -> str:
    """A whole number written in Chinese numerals, as Chinese writes it.

    Rules: digits are grouped by four (万 = 10^4, 亿 = 10^8), each group read with 千 百 十.
    A run of zeros between non-zero digits reads as one 零, also across a group boundary
    (一百零五 105, 一千零一十 1010, 一万零一百 10100, 一亿零一万 100010000); trailing zeros are
    not read (一千一百 1100, 三百二十 320). A number starting with 1x reads 十x (十 10, 十一 11,
    十万 100000), but inside a number the 一 stays (一百一十 110, 一千零一十 1010).

    Args:
      n: 0 <= n <= MAX_CHINESE_NUMERAL (10^12 - 1).
      liang: write 2 as 两 before 千, 百, 万 and 亿 (两千零一十九, 两百, 两万), as people usually
        say it; the default 二 (二千零一十九) is the written standard. 十 always takes 二 (二十).

    Raises:
      ValueError: n is not an int in range.
    """
    if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= MAX_CHINESE_NUMERAL:
        raise ValueError(f"n={n!r} must be an int in [0, {MAX_CHINESE_NUMERAL}]")
    if n == 0:
        return _DIGITS[0]
    out = []
    gap = False  # a zero group since the last one read, e.g. the 万 group of 100000001
    for i, unit in enumerate(_LARGE_UNITS):
        g = n // 10 ** (4 * (len(_LARGE_UNITS) - 1 - i)) % 10**4
        if g == 0:
            gap = bool(out)
            continue
        if out and (gap or g < 1000):  # the zeros before this group read as one 零
            out.append("零")
        gap = False
        if liang and g == 2 and unit:
            out.append("两" + unit)
        else:
            out.append(_group(g, leading=not out, liang=liang) + unit)
    return "".join(out)


def _below_thousand(n: int) -> str:
    hundreds, rest = divmod(n, 100)
    words = [f"{_ONES[hundreds]} hundred"] if hundreds else []
    if rest >= 20:
        tens, ones = divmod(rest, 10)
        words.append(_TENS[tens] + (f"-{_ONES[ones]}" if ones else ""))
    elif rest:
        words.append(_ONES[rest])
    return " ".join(words)


def english_number(n: int) -> str:
    """A whole number in English words, American style: no "and", hyphenated tens.

    one hundred five (105), twenty-three, one thousand ten (1010), one thousand one hundred
    (1100, never "eleven hundred"), two thousand nineteen, one million two, negative seven.
    Lower case, words separated by single spaces.

    Args:
      n: |n| <= MAX_ENGLISH_NUMBER (10^18 - 1, up to quadrillions).

    Raises:
      ValueError: n is not an int in range.
    """
    if not isinstance(n, int) or isinstance(n, bool) or abs(n) > MAX_ENGLISH_NUMBER:
        raise ValueError(f"n={n!r} must be an int with |n| <= {MAX_ENGLISH_NUMBER}")
    if n < 0:
        return "negative " + english_number(-n)
    if n == 0:
        return _ONES[0]
    words = []
    for i in reversed(range(len(_SCALES))):
        g = n // 1000**i % 1000
        if g:
            words.append(_below_thousand(g) + (f" {_SCALES[i]}" if i else ""))
    return " ".join(words)


def translate_problem(a: int, op: str, b: int) -> tuple[str, str]:
    """(Chinese source, English target) of `a op b`, e.g. (1, '+', 3) -> ('一加三',
    'one plus three equals four')."""
    if op not in OPERATIONS:
        raise ValueError(f"op={op!r} must be one of {tuple(OPERATIONS)}")
    zh_op, en_op, answer = OPERATIONS[op]
    if op == "/" and (b == 0 or a % b):
        raise ValueError(f"{a} / {b} is not an exact division; '/' needs b >= 1 dividing a")
    source = chinese_numeral(a) + zh_op + chinese_numeral(b)
    target = f"{english_number(a)} {en_op} {english_number(b)} equals {english_number(answer(a, b))}"
    return source, target


def _num_problems(op: str, m: int) -> int:
    """Distinct (a, b) of `op` with operands in [0, m]."""
    if op != "/":
        return (m + 1) ** 2
    # sum over b in [1, m] of (m // b + 1) quotients, in O(sqrt(m)) blocks of equal m // b.
    total, b = 0, 1
    while b <= m:
        q = m // b
        last = m // q
        total += (q + 1) * (last - b + 1)
        b = last + 1
    return total


def _checked(num_pairs: int, max_operand: int, operations: Sequence[str]) -> tuple[str, ...]:
    if not isinstance(max_operand, int) or not 1 <= max_operand <= MAX_OPERAND:
        raise ConfigError(f"max_operand={max_operand!r} must be an int in [1, {MAX_OPERAND}]")
    if isinstance(operations, str):
        operations = tuple(operations)  # "+-" is a natural way to write it
    operations = tuple(operations)
    if not operations or any(op not in OPERATIONS for op in operations):
        raise ConfigError(f"operations={operations!r} must be a non-empty sequence of "
                          f"{', '.join(repr(o) for o in OPERATIONS)}")
    if len(set(operations)) != len(operations):
        raise ConfigError(f"operations={operations!r} lists an operation more than once")
    available = sum(_num_problems(op, max_operand) for op in operations)
    if not isinstance(num_pairs, int) or not 1 <= num_pairs <= available:
        raise ConfigError(
            f"num_pairs={num_pairs!r} must be an int in [1, {available}]: operations "
            f"{operations} on operands up to max_operand={max_operand} give {available} distinct "
            "problems; raise max_operand or add operations for more")
    return operations


def translation_pairs(seed: int = 0, num_pairs: int = 20000, max_operand: int = 99,
                      operations: Sequence[str] = ("+", "-")) -> list[tuple[str, str]]:
    """`num_pairs` distinct arithmetic problems as (Chinese source, English target) pairs.

    Each pair draws an operation uniformly from `operations`, then operands uniformly in
    [0, max_operand] ('/': a divisor b in [1, max_operand] and a quotient q in
    [0, max_operand // b], a = b * q); a problem already drawn is drawn again, so no two pairs
    share a source. The order is random, so any prefix is a sample.

    Args:
      seed: drives every draw; equal arguments give equal pairs.
      num_pairs: how many pairs; at most the number of distinct problems (10,000 sums at
        max_operand=99).
      max_operand: the largest operand; 1 <= max_operand <= MAX_OPERAND (99,999,999).
      operations: any of '+', '-', '*', '/' (a sequence, or a string such as '+-').

    Raises:
      ValueError: an unknown operation, max_operand out of [1, MAX_OPERAND], or more pairs than
        there are distinct problems.
    """
    operations = _checked(num_pairs, max_operand, operations)
    rng = random.Random(seed)
    seen: set[tuple[int, str, int]] = set()
    pairs = []
    while len(pairs) < num_pairs:
        op = rng.choice(operations)
        if op == "/":
            b = rng.randint(1, max_operand)
            a = b * rng.randint(0, max_operand // b)
        else:
            a, b = rng.randint(0, max_operand), rng.randint(0, max_operand)
        if (a, op, b) not in seen:
            seen.add((a, op, b))
            pairs.append(translate_problem(a, op, b))
    return pairs


def translation_splits(seed: int = 0, num_pairs: int = 20000, max_operand: int = 99,
                       operations: Sequence[str] = ("+", "-")
                       ) -> dict[str, list[tuple[str, str]]]:
    """`translation_pairs(...)` cut 80 / 10 / 10 into 'train', 'validation' and 'test'.

    The pairs are distinct problems, so no source sentence is in two splits: validation and
    test measure problems never seen in training (though '三加五' may be in train and '五加三'
    in test).
    """
    pairs = translation_pairs(seed, num_pairs, max_operand, operations)
    splits, start = {}, 0
    for i, (name, fraction) in enumerate(SPLIT_FRACTIONS):
        end = len(pairs) if i == len(SPLIT_FRACTIONS) - 1 else start + round(fraction * len(pairs))
        if end == start:
            raise ConfigError(f"num_pairs={num_pairs} is too few to give every split a pair; "
                              "pass num_pairs >= 10")
        splits[name] = pairs[start:end]
        start = end
    return splits
