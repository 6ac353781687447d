"""has_answer (DPR rules) and SQuAD EM/F1 on hand-checked cases."""
import unicodedata

import pytest
import regex
from hypothesis import given, settings
from hypothesis import strategies as st

from fastdpr.eval.qa import best_exact_match, best_f1, exact_match_score, f1_score, normalize_answer
from fastdpr.text.answers import TOKEN_PATTERN, AnswerMatcher, has_answer, tokenize


def test_tokenize_splits_punctuation_and_keeps_marks():
    assert tokenize("The U.S. Army") == ["the", "u", ".", "s", ".", "army"]
    assert tokenize("1,000 km") == ["1", ",", "000", "km"]
    # NFD: the accent becomes a combining mark that stays inside its word's token
    assert tokenize("Röntgen") == ["ro\u0308ntgen"]
    assert tokenize("  tabs\tand\nnewlines ") == ["tabs", "and", "newlines"]


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40))
def test_tokenize_equals_dpr_reference(text):
    # the reference: DPR's capturing pattern through finditer, each whole match lowercased
    pat = regex.compile(TOKEN_PATTERN, flags=regex.IGNORECASE | regex.UNICODE | regex.MULTILINE)
    ref = [m.group().lower() for m in pat.finditer(unicodedata.normalize("NFD", text))]
    assert tokenize(text) == ref


_ADVERSARIAL = "aAbBΣσςΟΔοδİıiIßẞ.,'’-: \u0301\u0308\u0345é0123"


def _reference_has_answer(text, answers):
    # DPR's algorithm with no shortcut: tokenise both, look for a contiguous run
    tokens = tokenize(text)
    for a in answers:
        run = tokenize(a)
        if run and any(tokens[i:i + len(run)] == run for i in range(len(tokens) - len(run) + 1)):
            return True
    return False


@settings(max_examples=400, deadline=None)
@given(data=st.data(), text=st.text(alphabet=_ADVERSARIAL, max_size=40))
def test_has_answer_shortcut_equals_reference(data, text):
    # answers cut from the text itself (hits are common) and free strings; Greek sigmas, dotted I, sharp s and
    # combining marks are where lowercasing a whole string and a token differ
    i = data.draw(st.integers(0, len(text)))
    j = data.draw(st.integers(i, len(text)))
    answers = [text[i:j], data.draw(st.text(alphabet=_ADVERSARIAL, max_size=6))]
    assert has_answer(text, answers) == _reference_has_answer(text, answers)
    assert AnswerMatcher(answers)(text) == _reference_has_answer(text, answers)


def test_final_sigma_context_does_not_hide_a_match():
    # "ΟΔΟΣ.Α": lowercasing the whole string gives a medial σ, the token alone a final ς
    assert has_answer("ΟΔΟΣ.Α", ["οδος"]) == _reference_has_answer("ΟΔΟΣ.Α", ["οδος"])
    assert has_answer("ΟΔΟΣ.Α", ["ΟΔΟΣ"])


@pytest.mark.parametrize(
    "text, answers, expected",
    [
        # accents: precomposed and decomposed forms both match; stripping the accent does not
        ("Wilhelm Conrad R\u00f6ntgen won the first prize", ["Wilhelm Conrad Röntgen"], True),
        ("Wilhelm Conrad Ro\u0308ntgen won the first prize", ["Wilhelm Conrad R\u00f6ntgen"], True),
        ("Wilhelm Conrad Röntgen won", ["Rontgen"], False),
        ("Rontgen won", ["Röntgen"], False),
        # punctuation splitting
        ("he moved to the U.S. in 1990", ["U.S."], True),
        ("he moved to the U.S. in 1990", ["u.s"], True),  # ["u", ".", "s"] is a run of ["u",".","s","."]
        ("he moved to the US in 1990", ["U.S."], False),
        ("he moved to the U.S. in 1990", ["US"], False),
        # numbers are whole tokens
        ("the smallest prime above 30 is 31.", ["31"], True),
        ("the smallest prime above 30 is 31.", ["3"], False),
        ("it cost 1,000 dollars", ["1,000"], True),
        ("it cost 1,000 dollars", ["1000"], False),
        ("released on May 18, 2018 worldwide", ["May 18 , 2018"], True),  # NQ-style spaced answer
        # case
        ("PARIS is large", ["paris"], True),
        ("paris is large", ["PARIS"], True),
        # answers spanning punctuation
        ("Sir Henry Campbell-Bannerman followed", ["Campbell - Bannerman"], True),
        ("Sir Henry Campbell-Bannerman followed", ["Campbell-Bannerman"], True),
        ("Sir Henry Campbell-Bannerman followed", ["Campbell Bannerman"], False),
        ("the venue was Levi's Stadium.", ["Levi's Stadium"], True),
        # whole words only, contiguous only
        ("Obamacare passed", ["Obama"], False),
        ("Eiffel, the tower", ["Eiffel tower"], False),
        # any of several answers; none; empty answers never match
        ("a Scorpio born", ["Skorpio", "Scorpio"], True),
        ("nothing here", [], False),
        ("nothing here", ["", "  "], False),
        ("", ["x"], False),
    ],
)
def test_has_answer_string_mode(text, answers, expected):
    assert has_answer(text, answers) is expected
    assert AnswerMatcher(answers)(text) is expected


def test_title_only_match_is_a_miss():
    passage = {"id": "1", "title": "Paris", "text": "It is the capital and largest city of France."}
    assert not has_answer(passage["text"], ["Paris"])
    assert has_answer(passage["title"] + " " + passage["text"], ["Paris"])  # would be wrong to count


def test_has_answer_accepts_single_string():
    assert has_answer("the cat sat", "cat")


@pytest.mark.parametrize(
    "text, pattern, expected",
    [
        # real CuratedTREC patterns (tests/data/dpr_curated_sample.jsonl)
        ("Denali stands 20,320 feet tall", r"20\s?,?\s?(32|40)0\s?-?\s?f(ee|oo)t|6,194-meter|20,?237\s*f(oo|ee)?t", True),
        ("Denali stands 20,310 feet tall", r"20\s?,?\s?(32|40)0\s?-?\s?f(ee|oo)t|6,194-meter|20,?237\s*f(oo|ee)?t", False),
        ("Jerusalem lies 2,582 feet above", r"\b2,?[4567][0-9][0-9]\b", True),
        ("Jerusalem lies 12,582 feet above", r"\b2,?[4567][0-9][0-9]\b", False),
        ("AFTER THE FALL is a play", r"After the Fall|Finishing the Play", True),  # case-insensitive
        ("caf\u00e9 society", "cafe\u0301", True),  # NFD both sides
        ("cafe\u0301 society", "caf\u00e9", True),
        ("cafe society", "café", False),
        ("anything", "[unclosed", False),  # does not compile: a miss, not an error
        ("anything", "(?P<", False),
        ("a(b", r"a\(b", True),
    ],
)
def test_has_answer_regex_mode(text, pattern, expected):
    assert has_answer(text, [pattern], mode="regex") is expected


def test_regex_bad_pattern_does_not_hide_good_one():
    assert has_answer("Sweden makes Volvo", ["[bad", "sweden"], mode="regex")


def test_unknown_mode_rejected():
    with pytest.raises(ValueError, match="mode"):
        has_answer("x", ["x"], mode="fuzzy")


def test_matcher_on_pretokenised_text():
    m = AnswerMatcher(["New York"])
    assert m.matches_tokens(tokenize("I love new york!"))
    assert not m.matches_tokens(tokenize("new jersey, york"))


def test_normalize_answer():
    assert normalize_answer("The  Eiffel Tower!") == "eiffel tower"
    assert normalize_answer("an apple, a day") == "apple day"
    assert normalize_answer("Theatre") == "theatre"  # articles only as whole words


def test_exact_match_and_f1():
    assert exact_match_score("The Eiffel Tower", "eiffel tower.") == 1.0
    assert exact_match_score("Eiffel", "eiffel tower") == 0.0
    # pred [cat, sat], gold [cat, sat, on, mat]: precision 1, recall 1/2
    assert f1_score("the cat sat", "a cat sat on mat") == pytest.approx(2 / 3)
    assert f1_score("dog", "cat") == 0.0
    assert f1_score("the", "a") == 1.0  # both normalise to nothing
    assert f1_score("the", "cat") == 0.0
    # repeated tokens count with multiplicity: common = min counts
    assert f1_score("cat cat cat", "cat") == pytest.approx(2 * (1 / 3) * 1 / (1 / 3 + 1))


def test_best_over_gold_answers():
    assert best_exact_match("Denver Broncos", ["Carolina Panthers", "the Denver Broncos"]) == 1.0
    assert best_f1("Denver", ["Denver Broncos", "Broncos"]) == pytest.approx(2 / 3)
    assert best_f1("x", []) == 0.0


def test_squad_scores_live_in_eval_qa_and_the_old_names_still_import_with_a_warning():
    import fastdpr.text.answers as answers

    with pytest.warns(DeprecationWarning, match="fastdpr.eval.qa.best_f1"):
        from fastdpr.text.answers import best_f1 as old
    assert old is best_f1
    assert "best_f1" not in answers.__all__
    with pytest.raises(AttributeError):
        answers.no_such_name
