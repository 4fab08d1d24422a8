"""docs/options.md, written from the option table (options.py):
python -m ember.options_doc > docs/options.md."""
import sys
from typing import Dict

from .options import CLIS, FRONT_ENDS, OPTIONS


def _cell(value, unset) -> str:
    if value is None:
        return unset or "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    return f"`{value}`"


def markdown() -> str:
    """docs/options.md: every option, by section, with its flags and the front ends taking it."""
    lines = ["# Options", "",
             "Generated from `python/ember/options.py` by `python -m ember.options_doc > docs/options.md`;",
             "edit the table there, not here. Front ends: the Python classes `Llama` and `LLM`, and the commands",
             f"{', '.join(f'`{c}`' for c in CLIS)}. A bool option's flag takes an optional `0`/`1`",
             "(`-mmp 0`); its negative flag (`--no-...`) turns it off.", ""]
    sections: Dict[str, list] = {}
    for option in OPTIONS.values():
        sections.setdefault(option.section, []).append(option)
    for section, declared in sections.items():
        lines += [f"## {section[0].upper()}{section[1:]}", "",
                  "| Option | Flags | Default | Taken by | Sets | Meaning |", "|---|---|---|---|---|---|"]
        for o in declared:
            users = [f for f in FRONT_ENDS if o.name in FRONT_ENDS[f]]
            flags = ", ".join(f"`{f}`" for f in o.flags + o.negative) or "(Python only)"
            if o.env:
                flags += f", env `{o.env}`"
            shown = _cell(o.default, o.unset) + "".join(f"; {f}: {_cell(v, o.unset)}" for f, v in o.defaults.items())
            sets = ", ".join(f"`{s}::{o.field or o.name}`" for s in o.fields)
            choices = f" One of {', '.join(f'`{c}`' for c in o.choices)}." if o.choices else ""
            lines.append(f"| `{o.name}` | {flags} | {shown} | {', '.join(users)} | {sets} | "
                         f"{o.help.replace('|', '/')}.{choices} |")
        lines.append("")
    lines += ["## Adding an option", "",
              "1. `python/ember/options.py`: its declaration in `_OPTIONS` (name, section, help, type, default",
              "   and per-front-end defaults, flags, checks, the C++ params fields it sets) and its name in",
              "   `FRONT_ENDS` under each front end that takes it. Every parser, the keyword checks of `Llama`",
              "   and `LLM`, `options.fill` (options to a C++ params struct) and this page then carry it.",
              "2. The code that uses it. For the C++ core: the field in `ModelParams`, `ContextParams` or",
              "   `EngineParams` (`include/ember/model.h`, `engine.h`, with its default, which",
              "   `tests/test_options.py` checks against the table), its `def_rw` line in",
              "   `python/bindings/bind_model.cpp` or `bind_engine.cpp`, and the C++ that reads it. For a",
              "   Python option: the front end that reads it.",
              "3. A test of what it does. Then regenerate this page.", "",
              "ember-server's `--enable-prefix-caching` / `--no-enable-prefix-caching` took step 1 alone (the",
              "flags on the `enable_prefix_caching` declaration and its name under `ember-server`): `LLM`,",
              "`EngineParams` and the engine already had it.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.stdout.write(markdown())
