"""What the prompt knows of a command's arguments: the grey hint and the words Tab completes.

Both come from the syntax strings of ``cli.help_table`` (the table ``help COMMAND`` prints), read
as a small grammar: words separated by spaces; ``[...]`` an optional group (``[queue ...]``:
repeated); ``a|b`` a choice; UPPERCASE words are keywords typed as they are, lowercase words
are placeholders (``queue``, ``ms-timeout``); top-level `` | `` separates the forms of a
command with subcommands (``CLUSTER MEET ip port | NODES | ...``).

The words typed so far are matched against it the way a user reads the syntax: a word fills the
next placeholder, or opens the optional group whose keyword it is (options in any order), and
the hint is what is left, so it shrinks as arguments are typed, as redis-cli's does.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cli import help_table

#: Placeholders that name a queue: Tab offers the node's queue names there.
QUEUE_PLACEHOLDERS = frozenset({"queue", "dead-letter-queue"})


@dataclass(frozen=True)
class Item:
    text: str  # as written in the syntax, for the hint
    words: tuple[str, ...]  # inside the brackets, without a trailing "..."
    optional: bool
    repeat: bool


def _split_top(text: str, sep: str) -> list[str]:
    """``text`` split on ``sep`` outside brackets."""
    parts, depth, start, i = [], 0, 0, 0
    while i < len(text):
        ch = text[i]
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif depth == 0 and text.startswith(sep, i):
            parts.append(text[start:i])
            start = i + len(sep)
            i = start
            continue
        i += 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def parse_form(text: str) -> list[Item]:
    items = []
    for token in _split_top(text, " "):
        optional = token.startswith("[") and token.endswith("]")
        inner = token[1:-1] if optional else token
        words = inner.split()
        repeat = bool(words) and words[-1] == "..."
        if repeat:
            words = words[:-1]
        if words:
            items.append(Item(token, tuple(words), optional, repeat))
        elif token == "...":
            items.append(Item(token, ("...",), True, True))
    return items


def choices(word: str) -> list[str]:
    """The literal words a syntax word stands for: a keyword, or the plain words of a choice
    (``in|out|all``); none for a placeholder."""
    if word.isupper():
        return word.split("|")
    if "|" in word:
        return [w for w in word.split("|") if w.isalpha()]
    return []


def _is_literal(word: str, typed: str) -> bool:
    return typed.upper() in (c.upper() for c in choices(word))


@dataclass
class _State:
    rest: list[Item]
    pending: list[str] = field(default_factory=list)
    # After ``[STATE state ...]`` is entered, more placeholders may follow its keyword.
    open_repeat: str | None = None

    def feed(self, typed: str) -> bool:
        """Match one typed word; False when the syntax has no room for it."""
        if self.pending:
            self.pending.pop(0)
            return True
        ahead = []  # the optional items before the next required one
        for item in self.rest:
            if not item.optional:
                break
            ahead.append(item)
        for item in ahead:
            if _is_literal(item.words[0], typed):
                self._enter(item)
                return True
        if self.open_repeat is not None:
            return True
        if len(ahead) < len(self.rest):  # the required item takes it
            required = self.rest[len(ahead)]
            del self.rest[:len(ahead) + 1]
            self.pending = list(required.words[1:])
            return True
        for item in ahead:  # an optional placeholder: [cursor], [queue ...]
            if not choices(item.words[0]):
                self._enter(item)
                return True
        return False

    def _enter(self, item: Item) -> None:
        self.pending = list(item.words[1:])
        self.open_repeat = item.words[-1] if item.repeat and len(item.words) > 1 else None
        if not item.repeat:
            self.rest.remove(item)

    def hint(self) -> str:
        return " ".join(self.pending + [item.text for item in self.rest])

    def next_words(self) -> list[str]:
        """The syntax words a next typed word may stand for."""
        if self.pending:
            return [self.pending[0]]
        out = [self.open_repeat] if self.open_repeat is not None else []
        for item in self.rest:
            out.append(item.words[0])
            if not item.optional:
                break
        return out


@dataclass(frozen=True)
class Analysis:
    hint: str  # the syntax still to type ("" for none)
    keywords: list[str]  # keywords and choices that may come next
    wants_queue: bool  # the next word may be a queue name


def _state_for(entry: help_table.CommandHelp, words: list[str]) -> _State | list[str] | None:
    """The matcher after ``words`` (the arguments after the command name); for a command with
    subcommands and none typed yet, the subcommand names instead; None past the syntax."""
    forms = _split_top(entry.args, " | ")
    if len(forms) > 1:
        subs = [c for form in forms for c in choices(parse_form(form)[0].words[0])]
        if not words:
            return subs
        form = next((f for f in forms
                     if _is_literal(parse_form(f)[0].words[0], words[0])), None)
        if form is None:
            return None
        state = _State(parse_form(form)[1:])
        words = words[1:]
    else:
        state = _State(parse_form(entry.args))
    for word in words:
        if not state.feed(word):
            return None
    return state


def split_words(line: str) -> tuple[list[str], bool]:
    """The words of a line being typed, quotes kept (``"a b"`` is one word, an unclosed quote
    runs to the end), and whether the line ends between words."""
    words: list[str] = []
    current: list[str] = []
    quote: str | None = None
    escaped = in_word = False
    for ch in line:
        if quote is not None:
            current.append(ch)
            if escaped:
                escaped = False
            elif ch == "\\" and quote == '"':
                escaped = True
            elif ch == quote:
                quote = None
        elif ch.isspace():
            if in_word:
                words.append("".join(current))
                current, in_word = [], False
        else:
            in_word = True
            current.append(ch)
            if ch in "\"'":
                quote = ch
    if in_word:
        words.append("".join(current))
    return words, not in_word


def analyse(line: str) -> Analysis | None:
    """Hint and completions for a prompt line whose cursor is at its end; None when the line
    names no known command (or only part of its name)."""
    words, ends_with_space = split_words(line)
    entry = help_table.lookup(words[0]) if words else None
    if entry is None:
        return None
    if len(words) == 1 and not ends_with_space:  # a whole command name, cursor on it
        return Analysis(_spaced(entry.args, ""), [], False)
    done, partial = (words[1:], None) if ends_with_space else (words[1:-1], words[-1])
    state = _state_for(entry, done)
    if state is None:
        return None
    if isinstance(state, list):  # subcommands
        whole = entry.args
        if partial is not None:
            sub = _state_for(entry, [partial])
            whole = sub.hint() if isinstance(sub, _State) else whole
        return Analysis(_spaced(whole, partial), state, False)
    keywords = [c for w in state.next_words() for c in choices(w)]
    wants_queue = any(w in QUEUE_PLACEHOLDERS for w in state.next_words())
    if partial is not None:
        after = _State(list(state.rest), list(state.pending), state.open_repeat)
        # A keyword being typed leaves the options on show until it is whole (redis-cli too).
        if not any(k.upper().startswith(partial.upper()) and k.upper() != partial.upper()
                   for k in keywords) and after.feed(partial):
            state = after
    return Analysis(_spaced(state.hint(), partial), keywords, wants_queue)


def _spaced(hint: str, partial: str | None) -> str:
    return (" " + hint if partial is not None else hint) if hint else ""


def command_names() -> list[str]:
    return [c.name for c in help_table.COMMANDS]
