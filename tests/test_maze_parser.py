import time

from hypothesis import assume, given
from hypothesis import strategies as st

from envs.maze import action_text, parse_action

ACTIONS = [("move", d) for d in range(4)] + [("stop", "stop")]
SPACE = st.text(alphabet=" \t\n", max_size=3)
QUOTE = st.sampled_from(["'", '"'])


def canonical(action):
    return action_text("stop" if action[0] == "stop" else action[1])


def test_canonical_texts_round_trip():
    assert action_text(0) == "('move', 0)" and action_text("stop") == "('stop', 'stop')"
    assert [parse_action(canonical(a)) for a in ACTIONS] == ACTIONS


@given(st.text())
def test_never_raises_and_returns_none_or_a_valid_action(text):
    assert parse_action(text) in ACTIONS + [None]


@given(st.text(max_size=20), st.integers(min_value=1, max_value=50_000))
def test_very_long_input_is_handled(chunk, repeat):
    assert parse_action(chunk * repeat) in ACTIONS + [None]


def test_adversarial_long_input_stays_fast():
    # Many openings that almost match: a backtracking-prone pattern would take quadratic time or worse.
    for text in ["(" * 200_000, "( 'move' , " * 50_000, "(" + " " * 500_000, "('move', " * 50_000 + "4)"]:
        start = time.perf_counter()
        assert parse_action(text) is None
        assert time.perf_counter() - start < 1.0


@given(st.text(), st.sampled_from(ACTIONS), st.text())
def test_finds_an_action_embedded_in_any_text(prefix, action, suffix):
    assume(parse_action(prefix) is None)
    assert parse_action(prefix + canonical(action) + suffix) == action


WORD = st.sampled_from(["move", "Move", "MOVE"])


@given(SPACE, QUOTE, SPACE, SPACE, QUOTE, SPACE, st.integers(0, 3), st.booleans(), WORD)
def test_move_accepts_quote_styles_spacing_and_case(s1, q1, s2, s3, q2, s4, d, quoted_dir, word):
    direction = f"{q2}{d}{q2}" if quoted_dir else str(d)
    assert parse_action(f"({s1}{q1}{word}{q1}{s2},{s3}{direction}{s4})") == ("move", d)


@given(SPACE, QUOTE, SPACE, QUOTE, SPACE)
def test_stop_accepts_quote_styles_and_spacing(s1, q1, s2, q2, s3):
    assert parse_action(f"({s1}{q1}stop{q1}{s2},{s2}{q2}stop{q2}{s3})") == ("stop", "stop")


def test_first_valid_tuple_wins():
    assert parse_action("('move', 2) then ('move', 0)") == ("move", 2)
    assert parse_action("('move', 7) is not allowed, so ('stop', 'stop') and ('move', 1)") == ("stop", "stop")
    assert parse_action("('jump', 1) ('move', 12) ('move',3)") == ("move", 3)


def test_tuples_in_prose_and_mixed_quotes():
    assert parse_action('The target is above me, so I choose ("move", 1).') == ("move", 1)
    assert parse_action("I am on the red square.\nAction: (\"stop\", 'stop')") == ("stop", "stop")
    assert parse_action("<answer>( 'move' , 3 )</answer>") == ("move", 3)


def test_near_misses_do_not_parse():
    for text in ["", "()", "move 0", "('move', 4)", "('move', -1)", "('move', 1.5)", "('move', 12)",
                 "('stop')", "('stop', 'go')", "['move', 0]", "(move, 0)", "('move' 0)", "('move', ０)"]:
        assert parse_action(text) is None, text
