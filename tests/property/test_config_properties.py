"""Any value for any directive: CONFIG SET applies it within its range or refuses it with
Disque's text; nothing raises, and a refused value changes nothing."""

from __future__ import annotations

from hypothesis import example, given
from hypothesis import strategies as st

from broker.config import DIRECTIVES, Config, value_range

_VALUES = st.one_of(
    st.text(max_size=12),
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.sampled_from(["yes", "no", "1gb", "-1", "0", "normal 0 0 0", "normal 1mb 1mb 60",
                     "slave 0 0 0", "everysec", "always", "10kb", "1e3", " 1", "0x10"]),
)


@given(st.sampled_from(sorted(DIRECTIVES)), _VALUES)
@example("maxclients", "\u00b2")  # found by `make fuzz`: isdigit() but not int()
@example("maxmemory", "--5")
@example("client-output-buffer-limit", "normal 0 0 \u00b2")
def test_config_set_applies_within_range_or_refuses(name: str, value: str) -> None:
    cfg = Config()
    before = cfg.get(name)
    error = cfg.config_set(name, value)
    d = DIRECTIVES[name]
    if error is not None:
        assert isinstance(error, str) and error
        assert cfg.get(name) == before
        return
    if d.kind in ("int", "memory") and name != "hz":
        least, most = value_range(d)
        assert least <= getattr(cfg, name.replace("-", "_")) <= most
