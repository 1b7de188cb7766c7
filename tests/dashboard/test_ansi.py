"""node/ansi.py on literal bytes: colours become spans, everything else is escaped or dropped,
and chunks cut anywhere render as the whole does."""

from __future__ import annotations

import random
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from node.ansi import DEFAULT, AnsiToHtml, apply_sgr, color_256, to_html


def test_plain_text_is_escaped() -> None:
    assert to_html(b"<script>alert('x') & \"y\"</script>\n") == (
        "&lt;script&gt;alert('x') &amp; \"y\"&lt;/script&gt;\n")


def test_basic_and_bright_colours_bold_and_reset() -> None:
    out = to_html(b"a\x1b[31mred\x1b[1;44m bold on blue\x1b[0m plain \x1b[92mbright\x1b[m.")
    assert out == ('a<span class="f1">red</span>'
                   '<span class="f1 b4 ab"> bold on blue</span> plain '
                   '<span class="f10">bright</span>.')


def test_256_and_truecolor_become_inline_colours_from_numbers_only() -> None:
    assert to_html(b"\x1b[38;5;196mx") == '<span style="color:#ff0000">x</span>'
    assert to_html(b"\x1b[48;5;244mx") == '<span style="background:#808080">x</span>'
    assert to_html(b"\x1b[38;5;3mx") == '<span class="f3">x</span>'
    assert to_html(b"\x1b[38;2;1;2;300mx") == '<span style="color:#0102ff">x</span>'
    assert to_html(b"\x1b[38:2:10:20:30mx") == '<span style="color:#0a141e">x</span>'
    assert color_256(16) == "#000000" and color_256(231) == "#ffffff"
    assert color_256(232) == "#080808" and color_256(255) == "#eeeeee"


def test_attribute_toggles_and_inverse() -> None:
    s = apply_sgr(DEFAULT, "1;3;4;2")
    assert (s.bold, s.italic, s.underline, s.dim) == (True, True, True, True)
    s = apply_sgr(s, "22;23;24")
    assert s == DEFAULT
    assert to_html(b"\x1b[7mx") == '<span class="fi bi">x</span>'
    assert to_html(b"\x1b[31;7mx") == '<span class="fi b1">x</span>'  # red background
    assert to_html(b"\x1b[31;39mx") == "x"  # default foreground again: no span


def test_other_sequences_and_controls_are_dropped() -> None:
    raw = (b"\x1b[2K\x1b[1Gline\x1b]0;title\x07 \x1b]8;;http://x/\x1b\\link\x1b]8;;\x1b\\"
           b"\x07\x08\x00 end\x1bc")
    assert to_html(raw) == "line link end"


def test_carriage_returns() -> None:
    assert to_html(b"10%\r50%\r100%\r\ndone\n") == "10%\n50%\n100%\ndone\n"


def test_a_sequence_that_never_ends_is_garbage_not_a_hang() -> None:
    conv = AnsiToHtml()
    out = conv.feed(b"\x1b[")
    for _ in range(400):  # parameters, parameters ...: never a final byte
        out += conv.feed(b"1;")
        assert len(conv._pending) <= 512  # held back at most MAX_SEQUENCE characters
    out += conv.feed(b"\x01 after", final=True)
    assert "\x1b" not in out and "\x01" not in out and out.endswith("1; after")
    assert to_html(b"cut \x1b[3") == "cut "  # cut by the end of the output


def test_invalid_utf8_becomes_replacement_characters() -> None:
    assert to_html(b"ok \xff\xfe end") == "ok \ufffd\ufffd end"


SAMPLE = ("\x1b[1;32m✔ passed\x1b[0m 12 tests\r\n\x1b[38;5;208mwarn\x1b[39m: <b>&</b>\n"
          "progress 10%\rprogress 100%\r\n\x1b]8;;https://example.org/\x1b\\a link\x1b]8;;\x1b\\"
          "\x1b[41m red bg \x1b[49m\x1b[2K\x1b[Ké ü 漢字\n").encode()


@pytest.mark.parametrize("seed", range(30))
def test_chunks_cut_anywhere_render_as_the_whole(seed: int) -> None:
    whole = to_html(SAMPLE)
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(SAMPLE)), rng.randrange(1, 25)))
    conv = AnsiToHtml()
    parts = []
    start = 0
    for cut in [*cuts, len(SAMPLE)]:
        parts.append(conv.feed(SAMPLE[start:cut]))
        start = cut
    parts.append(conv.feed(b"", final=True))
    assert _text_and_styles(parts) == _text_and_styles([whole])


def _text_and_styles(parts: list[str]) -> list[tuple[str, str]]:
    """(character, its span attributes) for every character shown: chunked output may split a
    span in two, which shows the same."""
    out = []
    for part in parts:
        for m in re.finditer(r"<span([^>]*)>(.*?)</span>|([^<]+)", part, re.S):
            attrs, inner, bare = m.group(1) or "", m.group(2), m.group(3)
            text = inner if inner is not None else bare
            out += [(c, attrs) for c in text]
    return out


_OUR_TAGS = re.compile(r'<span(?: class="[a-z0-9 ]+")?(?: style="[a-z:#0-9;]+")?>|</span>')
_ALPHABET = st.sampled_from([b"\x1b", b"[", b"]", b"m", b";", b"3", b"8", b"5", b"2", b"1",
                             b"<", b">", b"&", b"\"", b"'", b"\r", b"\n", b"\x07", b"\\",
                             b"\xff", b"\xc3", b"\xa9", b"a", b":", b"\x00"])


@given(st.lists(st.lists(_ALPHABET, max_size=40).map(b"".join), max_size=8))
def test_no_input_reaches_the_page_unescaped(chunks: list[bytes]) -> None:
    conv = AnsiToHtml()
    out = "".join(conv.feed(c) for c in chunks) + conv.feed(b"", final=True)
    bare = _OUR_TAGS.sub("", out)
    assert "<" not in bare and ">" not in bare and "\x1b" not in bare
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f]", bare)
    # Every span opened is closed: the page's structure stays as it was.
    assert out.count("<span") == out.count("</span>")
