"""The embedded program-synthesis task and the minilang interpreter."""

import operator
import re

import pytest

from bonkernels.train import minilang
from bonkernels.train.tasks import make_task, truncate_at_stop
from bonkernels.train.tokenizer import CharTokenizer


def _reference_run(text, x):
    """Independent evaluation: regex tokenising and the operator module (Python's // and %)."""
    table = {"+": operator.add, "-": operator.sub, "*": operator.mul,
             "/": operator.floordiv, "%": operator.mod}
    assert re.fullmatch(r"([-+*/%]\d)+", text)
    for op, digit in re.findall(r"([-+*/%])(\d)", text):
        x = table[op](x, int(digit))
    return x


@pytest.mark.parametrize("text", ["+3", "*3+1", "-7%4", "/2*9-1", "%5%3", "-9/4"])
@pytest.mark.parametrize("x", [-13, -1, 0, 1, 7, 19])
def test_interpreter_matches_reference(text, x):
    assert minilang.run(text, x) == _reference_run(text, x)


@pytest.mark.parametrize("bad", ["", "+", "3+", "+a", "x3", "+3*", "__import__('os')",
                                 "+1" * 17, "+3 "])
def test_interpreter_rejects_malformed_text(bad):
    with pytest.raises(minilang.ProgramError):
        minilang.parse(bad)


def test_runtime_errors_are_program_errors():
    with pytest.raises(minilang.ProgramError):
        minilang.run("/0", 5)
    with pytest.raises(minilang.ProgramError):
        minilang.run("*9" * 16, 10**4)


def test_fraction_passed():
    cases = [(0, 1), (1, 4), (2, 7), (3, 9)]
    assert minilang.fraction_passed("*3+1", cases) == 0.75
    assert minilang.fraction_passed("garbage", cases) == 0.0


def test_problems_are_deterministic_and_seeded():
    a, b = make_task("synth", seed=7), make_task("synth", seed=7)
    c = make_task("synth", seed=8)
    assert [a.problem("train", i).prompt for i in range(20)] == \
           [b.problem("train", i).prompt for i in range(20)]
    assert [a.problem("train", i).prompt for i in range(20)] != \
           [c.problem("train", i).prompt for i in range(20)]
    assert a.problem("train", 3).prompt != a.problem("eval", 3).prompt


def test_problem_consistency_and_rewards():
    task = make_task("synth")
    tok = CharTokenizer()
    for i in range(200):
        p = task.problem("eval", i)
        shown, hidden = p.data["shown"], p.data["hidden"]
        assert len(shown) == 4 and len(hidden) == 8
        assert len({x for x, _ in shown + hidden}) == 12  # hidden inputs are new inputs
        # the prompt states exactly the shown cases
        pairs = [tuple(map(int, s.split(":"))) for s in p.prompt.rstrip("=").split(",")]
        assert pairs == shown
        for x, y in shown + hidden:
            assert _reference_run(p.solution, x) == y
        assert task.rewards([p], [p.solution]) == [1.0]
        assert tok.decode(tok.encode(p.prompt)) == p.prompt
        assert len(p.solution) + 1 <= task.max_new_tokens


def test_rewards_are_fractions_of_hidden_tests():
    task = make_task("synth")
    p = task.problem("train", 0)
    hidden = p.data["hidden"]
    for guess in ["+1", "*2", "-3%5", p.solution]:
        expected = sum(_reference_run(guess, x) == y for x, y in hidden) / len(hidden)
        assert task.rewards([p], [guess]) == [expected]


def test_truncate_at_stop():
    assert truncate_at_stop("*3+1=junk", ("=", ",")) == "*3+1"
    assert truncate_at_stop("*3", ("=",)) == "*3"


def test_char_tokenizer_roundtrip_and_errors(tmp_path):
    tok = CharTokenizer()
    text = "def f(x):\n\treturn x % 3  # ok"
    ids = tok.encode(text)
    assert tok.decode(ids + [tok.eos_id, tok.pad_id]) == text
    assert min(ids) >= 3 and max(ids) < tok.vocab_size
    tok.save(str(tmp_path))
    assert CharTokenizer.load(str(tmp_path)).encode(text) == ids
    assert tok.decode(tok.encode("a≤b➞c")) == "a?b?c"
