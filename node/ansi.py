"""Terminal output to HTML for the dashboard's job logs: SGR colours to spans, all else escaped.

Theory of operation
-------------------
A job's output arrives in chunks cut anywhere (``Run.read_output``): in the middle of a UTF-8
character or of an escape sequence, and a colour set in one chunk applies to the next. So
``AnsiToHtml`` is a feed/output object: ``feed(data)`` takes bytes and returns the HTML for
everything complete so far, keeping the SGR state, the bytes of an unfinished character
(an incremental UTF-8 decoder, invalid bytes become U+FFFD) and an unfinished escape sequence
for the next call.

What is rendered: text, HTML-escaped; ``\\n`` and ``\\t``; a lone ``\\r`` (a progress bar
redrawing its line) as a line break, ``\\r\\n`` as one. SGR (``ESC [ ... m``): reset, bold,
dim, italic, underline, inverse, the 8 + 8 bright colours (classes ``f0``..``f15`` and
``b0``..``b15``, themed by the CSS), 256 colours and 24-bit colours (``38;5;n``, ``38;2;r;g;b``
and their ``:`` forms, inline ``color``/``background`` computed here from numbers only). Every
other escape sequence (cursor moves, erase, titles and links by OSC) and every other control
character is dropped: the page never shows raw escapes and no byte of the output reaches
the page unescaped. An escape sequence that does not end within ``MAX_SEQUENCE`` characters
is dropped as garbage.
"""

from __future__ import annotations

import codecs
import html
import re
from dataclasses import dataclass, replace
from typing import Final

MAX_SEQUENCE: Final = 512  # OSC 8 hyperlinks carry a URL
ESC: Final = "\x1b"
# A complete CSI sequence: parameters, intermediates, a final byte.
_CSI = re.compile(r"\x1b\[([0-?]*)([ -/]*)([@-~])")
# A complete OSC sequence, ended by BEL or ST (ESC \).
_OSC = re.compile(r"\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)")
# Controls other than \t and \n (a lone \r is handled before), and DEL.
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")

# xterm's 6x6x6 cube levels for colours 16..231.
_CUBE = (0, 95, 135, 175, 215, 255)


def color_256(n: int) -> str:
    """The CSS colour of xterm colour ``n`` in 16..255 (0..15 are classes)."""
    if n < 232:
        n -= 16
        r, g, b = _CUBE[n // 36], _CUBE[n // 6 % 6], _CUBE[n % 6]
    else:
        r = g = b = 8 + (n - 232) * 10
    return f"#{r:02x}{g:02x}{b:02x}"


Color = int | str | None  # 0..15: a class; "#rrggbb": inline; None: the default


@dataclass(frozen=True)
class Style:
    fg: Color = None
    bg: Color = None
    bold: bool = False
    dim: bool = False
    italic: bool = False
    underline: bool = False
    inverse: bool = False

    def attributes(self) -> str:
        """The span's attributes for this style ('' for the default style)."""
        fg, bg = (self.bg, self.fg) if self.inverse else (self.fg, self.bg)
        classes: list[str] = []
        styles: list[str] = []
        for value, prefix, prop, inverse_default in ((fg, "f", "color", "fi"),
                                                     (bg, "b", "background", "bi")):
            if isinstance(value, int):
                classes.append(f"{prefix}{value}")
            elif isinstance(value, str):
                styles.append(f"{prop}:{value}")
            elif self.inverse:
                classes.append(inverse_default)  # the default colours swapped
        for flag, name in ((self.bold, "ab"), (self.dim, "ad"), (self.italic, "ai"),
                           (self.underline, "au")):
            if flag:
                classes.append(name)
        out = ""
        if classes:
            out += f' class="{" ".join(classes)}"'
        if styles:
            out += f' style="{";".join(styles)}"'
        return out


DEFAULT: Final = Style()


def _extended(params: list[int], i: int) -> tuple[Color, int]:
    """A 38/48 colour starting after the 38/48 at ``params[i]``: (colour, params used)."""
    if i + 1 < len(params) and params[i + 1] == 5 and i + 2 < len(params):
        n = params[i + 2]
        if 0 <= n <= 15:
            return n, 3
        if 16 <= n <= 255:
            return color_256(n), 3
        return None, 3
    if i + 1 < len(params) and params[i + 1] == 2 and i + 4 < len(params):
        r, g, b = (min(255, max(0, v)) for v in params[i + 2:i + 5])
        return f"#{r:02x}{g:02x}{b:02x}", 5
    return None, len(params) - i  # malformed: ignore the rest


def apply_sgr(style: Style, raw: str) -> Style:
    """The style after ``ESC [ raw m``."""
    params = [int(p) if p.isdigit() else 0 for p in re.split(r"[;:]", raw)] if raw else [0]
    i = 0
    while i < len(params):
        p = params[i]
        used = 1
        if p == 0:
            style = DEFAULT
        elif p == 1:
            style = replace(style, bold=True)
        elif p == 2:
            style = replace(style, dim=True)
        elif p == 3:
            style = replace(style, italic=True)
        elif p == 4:
            style = replace(style, underline=True)
        elif p == 7:
            style = replace(style, inverse=True)
        elif p == 22:
            style = replace(style, bold=False, dim=False)
        elif p == 23:
            style = replace(style, italic=False)
        elif p == 24:
            style = replace(style, underline=False)
        elif p == 27:
            style = replace(style, inverse=False)
        elif 30 <= p <= 37:
            style = replace(style, fg=p - 30)
        elif 90 <= p <= 97:
            style = replace(style, fg=p - 90 + 8)
        elif 40 <= p <= 47:
            style = replace(style, bg=p - 40)
        elif 100 <= p <= 107:
            style = replace(style, bg=p - 100 + 8)
        elif p == 39:
            style = replace(style, fg=None)
        elif p == 49:
            style = replace(style, bg=None)
        elif p in (38, 48):
            color, used = _extended(params, i)
            style = replace(style, fg=color) if p == 38 else replace(style, bg=color)
        i += used
    return style


class AnsiToHtml:
    def __init__(self) -> None:
        self.style = DEFAULT
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._pending = ""  # an escape sequence, or a "\r" whose next character is unknown

    def feed(self, data: bytes, final: bool = False) -> str:
        """HTML for ``data`` after what was fed before. ``final``: no more data will come, so
        whatever is pending is flushed (an unfinished sequence is dropped)."""
        text = self._pending + self._decoder.decode(data, final)
        self._pending = ""
        out: list[str] = []
        pos = 0
        n = len(text)
        while pos < n:
            esc = text.find(ESC, pos)
            cr = text.find("\r", pos)
            stop = min(x for x in (esc, cr, n) if x >= 0)
            if stop > pos:
                self._text(text[pos:stop], out)
            pos = stop
            if pos >= n:
                break
            if text[pos] == "\r":
                if pos + 1 >= n and not final:
                    self._pending = "\r"  # "\r\n" split across chunks is still one break
                    break
                out.append("\n")
                pos += 2 if text.startswith("\r\n", pos) else 1
                continue
            consumed = self._escape(text, pos, final)
            if consumed == 0:  # unfinished: wait for the rest
                self._pending = text[pos:]
                break
            pos += consumed
        return "".join(out)

    def _escape(self, text: str, pos: int, final: bool) -> int:
        """Characters taken by the escape sequence at ``pos``; 0 if it may still go on."""
        m = _CSI.match(text, pos)
        if m is not None:
            if m.group(3) == "m" and not m.group(2):
                self.style = apply_sgr(self.style, m.group(1))
            return m.end() - pos
        m = _OSC.match(text, pos)
        if m is not None:
            return m.end() - pos
        rest = len(text) - pos
        if rest < MAX_SEQUENCE and _may_continue(text[pos:]):
            return rest if final else 0  # cut by the end of the output: dropped
        if rest >= 2 and text[pos + 1] not in "[]":
            return 2  # a two-character escape (ESC c, ESC 7 ...): dropped
        # Garbage (too long, or cut at the end): drop the ESC and show what follows as text.
        return 1

    def _text(self, chunk: str, out: list[str]) -> None:
        chunk = _CONTROLS.sub("", chunk)
        if not chunk:
            return
        escaped = html.escape(chunk, quote=False)
        attributes = self.style.attributes()
        out.append(f"<span{attributes}>{escaped}</span>" if attributes else escaped)


def _may_continue(seq: str) -> bool:
    """Could ``seq`` (starting with ESC) become a complete sequence with more characters?"""
    if len(seq) == 1:
        return True
    if seq[1] == "[":
        return re.fullmatch(r"\x1b\[[0-?]*[ -/]*", seq) is not None
    if seq[1] == "]":
        return re.fullmatch(r"\x1b\][^\x07\x1b]*\x1b?", seq) is not None
    return False


def to_html(data: bytes) -> str:
    """One whole output at once."""
    return AnsiToHtml().feed(data, final=True)
