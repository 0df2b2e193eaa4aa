"""`gpufleet completion bash|zsh`: shell completion generated from the command's own parser, so
every command, subcommand and flag it has is completed and none it lacks.

    source <(gpufleet completion bash)     # in ~/.bashrc
    source <(gpufleet completion zsh)      # in ~/.zshrc (zsh runs the bash function through
                                           # bashcompinit, which ships with zsh)

Written here rather than with a completion library (argcomplete): that would run Python on
every Tab press; this script is plain shell, with the words baked in."""

from __future__ import annotations

import argparse
import shlex

SHELLS = ("bash", "zsh")


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:  # argparse keeps subcommands only here
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _flags(parser: argparse.ArgumentParser) -> list[str]:
    return sorted(s for a in parser._actions for s in a.option_strings if s.startswith("--"))


def words(parser: argparse.ArgumentParser) -> dict[str, list[str]]:
    """What may follow each command path: '' -> top-level commands and flags; 'nodes' -> its
    flags; 'breaker' -> its subcommands; 'breaker status' -> its flags."""
    out: dict[str, list[str]] = {}

    def walk(path: str, p: argparse.ArgumentParser) -> None:
        subs = _subparsers(p)
        out[path] = sorted(subs) + _flags(p)
        for name, child in subs.items():
            walk(f"{path} {name}".strip(), child)

    walk("", parser)
    return out


def script(parser: argparse.ArgumentParser, shell: str) -> str:
    cases = "\n".join(
        f"        {shlex.quote(path or '_')}) opts={shlex.quote(' '.join(options))} ;;"
        for path, options in sorted(words(parser).items())
    )
    bash = f"""_gpufleet() {{
    local cur path word opts
    cur="${{COMP_WORDS[COMP_CWORD]}}"
    path=""
    for word in "${{COMP_WORDS[@]:1:COMP_CWORD-1}}"; do
        case "$word" in
            -*) ;;
            *) [ -n "$(_gpufleet_words "${{path:+$path }}$word")" ] && path="${{path:+$path }}$word" ;;
        esac
    done
    opts="$(_gpufleet_words "$path")"
    COMPREPLY=( $(compgen -W "$opts" -- "$cur") )
}}
_gpufleet_words() {{
    local opts=""
    case "${{1:-_}}" in
{cases}
    esac
    printf '%s' "$opts"
}}
complete -F _gpufleet gpufleet
"""
    if shell == "zsh":
        return "autoload -U +X bashcompinit && bashcompinit\n" + bash
    return bash
